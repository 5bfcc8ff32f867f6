"""file_ops: every operation, every way out of the workspace refused, and a symlink-swap race that never escapes."""

import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from tools_app.builtin.files import MAX_READ_BYTES, FileOps
from tools_app.chokepoint.base import ToolContext, ToolInputError
from tools_app.command_policy import CommandPolicy
from tools_app.sandbox import WorkspaceSandbox, sandbox_probe
from tools_app.sandbox.engine import agent_uid

AGENT_ID = 4242


@pytest.fixture(scope="module")
def data_dir():
    path = Path(settings.DATA_DIR) / f"file-ops-test-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def sandbox(data_dir):
    return WorkspaceSandbox(data_dir=data_dir, policy=CommandPolicy(), report=sandbox_probe(data_dir=data_dir))


@pytest.fixture
def agent_name():
    return f"files-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def workspace(sandbox, agent_name):
    return sandbox.workspace(agent_id=AGENT_ID, agent_name=agent_name).path


@pytest.fixture
def outside(data_dir):
    path = data_dir / f"outside-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    (path / "secret.txt").write_text("OUTSIDE SECRET")
    return path


@pytest.fixture
def ops(sandbox, agent_name, workspace):
    tool = FileOps(sandbox=sandbox)
    ctx = ToolContext("call", AGENT_ID, agent_name, "ops", None, True)

    def call(**raw):
        return asyncio.run(tool.run(tool.parse(raw), ctx))

    return call


def ok(result):
    assert result.success, result.error
    return result.output


def refused(result, code="path_refused"):
    assert not result.success and result.error.code == code, (result.output, result.error)
    return result.error.message


# -- the operations ---------------------------------------------------------------------------------------------------


def test_write_read_append_stat(ops, workspace, sandbox):
    assert ok(ops(operation="write", path="notes/today.txt", content="hello\n"))["bytes_written"] == 6
    assert ok(ops(operation="append", path="notes/today.txt", content="again\n"))["size"] == 12
    assert ok(ops(operation="read", path="notes/today.txt"))["content"] == "hello\nagain\n"
    assert ok(ops(operation="write", path="notes/today.txt", content="over"))["size"] == 4
    info = ok(ops(operation="stat", path="notes/today.txt"))
    assert (info["type"], info["size"], info["links"]) == ("file", 4, 1)
    assert ok(ops(operation="stat"))["type"] == "directory"
    if sandbox.report.uid is not None:
        # What the gateway writes belongs to the agent's uid, so its own commands can change it.
        for path in (workspace / "notes", workspace / "notes" / "today.txt"):
            assert (path.stat().st_uid, path.stat().st_gid) == (agent_uid(AGENT_ID), agent_uid(AGENT_ID))


def test_list_mkdir_copy_move_delete(ops, workspace):
    ok(ops(operation="mkdir", path="a/b/c"))
    ok(ops(operation="write", path="a/one.txt", content="1"))
    listing = ok(ops(operation="list", path="a"))
    assert [(e["name"], e["type"]) for e in listing["entries"]] == [("b", "directory"), ("one.txt", "file")]
    ok(ops(operation="copy", path="a/one.txt", destination="a/b/two.txt"))
    assert (workspace / "a/b/two.txt").read_text() == "1"
    refused(ops(operation="copy", path="a/one.txt", destination="a/b/two.txt"), "exists")
    ok(ops(operation="move", path="a/b/two.txt", destination="moved/three.txt"))
    assert (workspace / "moved/three.txt").read_text() == "1" and not (workspace / "a/b/two.txt").exists()
    refused(ops(operation="move", path="a/one.txt", destination="moved/three.txt"), "exists")
    assert ok(ops(operation="delete", path="a"))["deleted"] == "directory"
    assert ok(ops(operation="delete", path="moved/three.txt"))["deleted"] == "file"
    assert not (workspace / "a").exists()
    refused(ops(operation="delete", path="."), "path_refused")
    refused(ops(operation="read", path="missing.txt"), "not_found")


def test_search_by_name_and_by_content(ops):
    ok(ops(operation="write", path="src/app.py", content="import os\nTOKEN_NAME = 'x'\n"))
    ok(ops(operation="write", path="src/lib/tokenizer.py", content="pass\n"))
    ok(ops(operation="write", path="README.md", content="nothing here\n"))
    found = ok(ops(operation="search", query="token"))
    assert {(m["path"], m["match"]) for m in found["matches"]} == {
        ("src/lib/tokenizer.py", "name"),
        ("src/app.py", "content"),
    }
    line = next(m for m in found["matches"] if m["match"] == "content")
    assert (line["line"], line["text"]) == (2, "TOKEN_NAME = 'x'")
    assert [m["path"] for m in ok(ops(operation="search", path="src", query="*.py"))["matches"]] == [
        "src/app.py",
        "src/lib/tokenizer.py",
    ]


def test_reads_and_writes_are_capped_with_clear_errors(ops, workspace):
    (workspace / "big.bin").write_bytes(b"a" * (MAX_READ_BYTES + 1))
    assert "reads at most" in refused(ops(operation="read", path="big.bin"), "too_large")
    (workspace / "binary.bin").write_bytes(b"\xff\xfe\x00")
    refused(ops(operation="read", path="binary.bin"), "not_text")
    tool = FileOps(sandbox=None)
    with pytest.raises(ToolInputError):
        tool.parse({"operation": "write", "path": "x", "content": "a" * (MAX_READ_BYTES + 1)})
    with pytest.raises(ToolInputError):
        tool.parse({"operation": "write", "path": "x"})


# -- every way out is refused ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["../escape.txt", "a/../../escape.txt", "..", "/etc/passwd", "/", "a\x00b"])
def test_dotdot_absolute_and_nul_are_refused(ops, path):
    for operation in ("read", "write", "list", "stat", "delete"):
        refused(ops(operation=operation, path=path, content="x"))


def test_a_symlink_out_is_refused(ops, workspace, outside):
    os.symlink(outside / "secret.txt", workspace / "link.txt")
    os.symlink(outside, workspace / "linkdir")
    for operation in ("read", "write", "append", "delete"):
        message = refused(ops(operation=operation, path="link.txt", content="x"))
        assert "symlink" in message
    refused(ops(operation="read", path="linkdir/secret.txt"))
    refused(ops(operation="write", path="linkdir/new.txt", content="x"))
    refused(ops(operation="list", path="linkdir"))
    refused(ops(operation="copy", path="link.txt", destination="copy.txt"))
    refused(ops(operation="copy", path="ok.txt", destination="linkdir/copy.txt"), "not_found")
    assert (outside / "secret.txt").read_text() == "OUTSIDE SECRET"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    # stat and list describe the link without following it.
    assert ok(ops(operation="stat", path="link.txt"))["type"] == "symlink"


def test_a_symlink_to_proc_self_root_is_refused(ops, workspace):
    os.symlink("/proc/self/root", workspace / "root")
    refused(ops(operation="read", path="root/etc/passwd"))
    refused(ops(operation="list", path="root"))
    refused(ops(operation="write", path="root/tmp/owned", content="x"))


def test_a_hard_link_is_refused(ops, workspace, outside):
    os.link(outside / "secret.txt", workspace / "hard.txt")
    assert "hard link" in refused(ops(operation="read", path="hard.txt"))
    refused(ops(operation="write", path="hard.txt", content="overwritten"))
    refused(ops(operation="append", path="hard.txt", content="more"))
    refused(ops(operation="delete", path="hard.txt"))
    assert (outside / "secret.txt").read_text() == "OUTSIDE SECRET"


def test_non_regular_files_are_refused_without_blocking(ops, workspace):
    os.mkfifo(workspace / "pipe")
    refused(ops(operation="read", path="pipe"), "not_a_file")
    refused(ops(operation="delete", path="pipe"), "not_a_file")


# -- the race ---------------------------------------------------------------------------------------------------------

# Runs in a process of its own, so the swaps go on in parallel with the reads rather than taking turns on the GIL.
SWAPPER = """
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = sys.argv[1].encode(), sys.argv[2].encode()
swaps = 0
def stop(*_):
    print(swaps, flush=True)
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    if libc.renameat2(-100, a, -100, b, 2) != 0:
        sys.exit(f"renameat2: {os.strerror(ctypes.get_errno())}")
    swaps += 1
"""


@pytest.mark.parametrize("swapped", ["directory", "file"])
def test_a_symlink_swap_race_never_reads_the_outside_file(sandbox, agent_name, workspace, outside, swapped):
    """Another process swaps a name between the real thing and a symlink out while file_ops reads it 20,000 times."""
    if swapped == "directory":
        (workspace / "d").mkdir()
        (workspace / "d" / "secret.txt").write_text("inside")
        os.symlink(outside, workspace / "d-swap")
        pair, path = (workspace / "d", workspace / "d-swap"), "d/secret.txt"
    else:
        (workspace / "secret.txt").write_text("inside")
        os.symlink(outside / "secret.txt", workspace / "secret-swap")
        pair, path = (workspace / "secret.txt", workspace / "secret-swap"), "secret.txt"
    tool = FileOps(sandbox=sandbox)
    ctx = ToolContext("race", AGENT_ID, agent_name, "ops", None, True)
    args = tool.parse({"operation": "read", "path": path})
    outcomes = {"inside": 0, "refused": 0, "outside": 0, "other": 0}

    async def reads():
        for _ in range(20_000):
            result = await tool.call(args, ctx)
            if result.success:
                outcomes["inside" if result.output["content"] == "inside" else "outside"] += 1
            elif result.error.code == "path_refused":
                outcomes["refused"] += 1
            else:
                outcomes["other"] += 1

    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, *map(str, pair)], stdout=subprocess.PIPE, text=True)
    try:
        assert swapper.stdout.readline() == "ready\n"
        asyncio.run(reads())
    finally:
        swapper.terminate()
        swaps = int(swapper.stdout.readline() or 0)
        swapper.wait()
    assert outcomes["outside"] == 0, outcomes
    assert sum(outcomes.values()) == 20_000
    # The race really ran: the name was swapped throughout, and reads met both states.
    assert swaps > 1000 and outcomes["inside"] > 0 and outcomes["refused"] > 0, (swaps, outcomes)
