"""The sandbox at every layer this machine has: kills whole trees, caps output, keeps files, network and secrets in."""

import ast
import dataclasses
import fcntl
import os
import platform
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from tools_app.command_policy import CommandPolicy
from tools_app.sandbox import (
    ExecRequest,
    LayerCheck,
    ProbeReport,
    SandboxRefused,
    WorkspaceSandbox,
    kernel,
    sandbox_probe,
)
from tools_app.sandbox.engine import UID_BASE, agent_uid, lock_dir
from tools_app.sandbox.runner import uid_processes

LAYERS = ["bubblewrap", "landlock", "rlimits"]
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def data_dir():
    path = Path(settings.DATA_DIR) / f"sandbox-test-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def report(data_dir):
    return sandbox_probe(data_dir=data_dir)


@pytest.fixture(params=LAYERS)
def sandbox(request, report, data_dir):
    """A sandbox forced to one layer; a layer this machine lacks is skipped with the probe's own reason."""
    level = request.param
    check = report.check(level)
    if not check.ok:
        pytest.skip(f"{level} does not work here: {check.reason}")
    return WorkspaceSandbox(data_dir=data_dir, policy=CommandPolicy(), report=report, level=level)


_agent_ids = iter(range(5000, 6000))


def run(sandbox, source, *, language="bash", agent_id=None, **options):
    agent_id = agent_id or next(_agent_ids)
    request = ExecRequest(
        agent_id=agent_id, agent_name=f"agent-{agent_id}", language=language, source=source, **options
    )
    return sandbox.run_blocking(request)


def workspace_of(sandbox, agent_id):
    return sandbox.workspace(agent_id=agent_id, agent_name=f"agent-{agent_id}").path


def needs_uid_drop(report):
    if report.uid is None:
        pytest.skip(report.uid_reason)


# -- the probe and its report: always run ----------------------------------------------------------------------------


def test_the_probe_checks_every_layer_and_explains_each_failure(report):
    assert [c.level for c in report.checks] == LAYERS
    for check in report.checks:
        assert check.ok or check.reason, check
        assert check.ms >= 0
    assert report.level == next((c.level for c in report.checks if c.ok), "none")
    data = report.as_dict()
    assert set(data) >= {"level", "degraded", "status", "reasons", "layers"}
    assert data["degraded"] == (report.level != "bubblewrap" or report.uid is None)
    for check in report.checks:
        if check.level == report.level:
            break
        assert any(r.startswith(f"{check.level}: ") and check.reason in r for r in data["reasons"])


def test_the_probe_tells_the_truth_about_bubblewrap(report, data_dir):
    """An independent bwrap run, as the probe's uid, must agree with the probe."""
    bwrap = shutil.which("bwrap")
    check = report.check("bubblewrap")
    if bwrap is None:
        assert not check.ok and "bwrap is not installed" in check.reason
        return
    ids = {"user": report.uid, "group": report.uid, "extra_groups": []} if report.uid is not None else {}
    # Under the probe's own lock: another server's probe starts by killing everything of this uid.
    with open(lock_dir(data_dir / "sandbox") / "probe.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        direct = run_bwrap(bwrap, ids)
    assert check.ok == (direct.returncode == 0), (check, direct.stderr)


def run_bwrap(bwrap, ids):
    return subprocess.run(
        [
            bwrap,
            "--unshare-all",
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "true",
        ],
        capture_output=True,
        **ids,
    )


def test_the_probe_tells_the_truth_about_landlock(report):
    check = report.check("landlock")
    try:
        kernel.landlock_abi()
    except kernel.KernelFeatureMissing as missing:
        assert not check.ok and str(missing) in check.reason
    else:
        assert check.ok, check.reason


def test_a_minimum_level_above_the_probed_one_refuses_every_command(report, data_dir):
    strict = dataclasses.replace(report, min_level="bubblewrap")
    below = next((c.level for c in report.checks if c.ok and c.level != "bubblewrap"), None)
    if below is None:
        pytest.skip("no layer below bubblewrap works here to run under a bubblewrap minimum")
    sandbox = WorkspaceSandbox(data_dir=data_dir, policy=CommandPolicy(), report=strict, level=below)
    with pytest.raises(SandboxRefused) as refused:
        run(sandbox, "echo hi")
    assert refused.value.code == "sandbox_unavailable"
    assert "ALEPH_SANDBOX_MIN_LEVEL=bubblewrap" in refused.value.message


def test_min_level_is_reported_as_refused_and_the_reasons_say_why():
    checks = (
        LayerCheck("bubblewrap", False, "bwrap: No permissions to create a new namespace", 1.0),
        LayerCheck("landlock", False, "landlock_create_ruleset: ENOSYS (Function not implemented)", 1.0),
        LayerCheck("rlimits", True, "", 1.0),
    )
    report = ProbeReport(checks=checks, uid=UID_BASE, uid_reason="", min_level="landlock")
    assert report.level == "rlimits" and report.status == "refused" and report.degraded
    assert report.reasons[:2] == [
        "bubblewrap: bwrap: No permissions to create a new namespace",
        "landlock: landlock_create_ruleset: ENOSYS (Function not implemented)",
    ]
    assert "ALEPH_SANDBOX_MIN_LEVEL=landlock" in report.reasons[-1]
    assert dataclasses.replace(report, min_level=None).status == "degraded"
    assert dataclasses.replace(report, min_level="rlimits").status == "degraded"


def test_when_no_layer_works_nothing_runs(data_dir):
    checks = tuple(LayerCheck(level, False, f"{level} broke", 1.0) for level in LAYERS)
    report = ProbeReport(checks=checks, uid=None, uid_reason="not root")
    assert report.level == "none" and report.status == "unavailable"
    sandbox = WorkspaceSandbox(data_dir=data_dir, policy=CommandPolicy(), report=report)
    with pytest.raises(SandboxRefused) as refused:
        run(sandbox, "echo hi")
    assert refused.value.code == "sandbox_unavailable" and "rlimits: rlimits broke" in refused.value.message


def test_a_forced_layer_must_be_one_the_probe_saw_work(data_dir):
    checks = tuple(LayerCheck(level, level == "rlimits", "" if level == "rlimits" else "nope", 1.0) for level in LAYERS)
    report = ProbeReport(checks=checks, uid=None, uid_reason="not root")
    with pytest.raises(ValueError, match="nope"):
        WorkspaceSandbox(data_dir=data_dir, policy=CommandPolicy(), report=report, level="bubblewrap")


def test_sandbox_check_prints_the_probe(capsys):
    call_command("sandbox_check")
    out = capsys.readouterr().out
    assert out.startswith("sandbox level: ")
    for level in LAYERS:
        assert f"  {level}" in out


def test_sandbox_check_fails_below_the_minimum(monkeypatch, report):
    if report.level == "bubblewrap":
        monkeypatch.setattr("tools_app.sandbox.probe.LAYERS", {**_layers(), "bubblewrap": _Broken})
    monkeypatch.setattr(settings, "SANDBOX_MIN_LEVEL", "bubblewrap")
    with pytest.raises(CommandError, match="ALEPH_SANDBOX_MIN_LEVEL=bubblewrap"):
        call_command("sandbox_check")


def _layers():
    from tools_app.sandbox.layers import LAYERS as real

    return real


class _Broken:
    def __init__(self):
        raise kernel.KernelFeatureMissing("bwrap: setting up uid map: Permission denied")


def test_the_probe_records_a_failing_layer_with_its_exact_reason(monkeypatch, data_dir):
    monkeypatch.setattr("tools_app.sandbox.probe.LAYERS", {**_layers(), "bubblewrap": _Broken})
    report = sandbox_probe(data_dir=data_dir)
    assert report.check("bubblewrap").reason == "bwrap: setting up uid map: Permission denied"
    assert report.level != "bubblewrap"
    assert "bubblewrap: bwrap: setting up uid map: Permission denied" in report.reasons


# -- commands at each layer -------------------------------------------------------------------------------------------


def test_echo_runs_and_reports_its_layer(sandbox):
    result = run(sandbox, "echo hi")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "hi\n", "")
    assert result.layer == sandbox.level
    assert result.degraded == (sandbox.level != "bubblewrap" or sandbox.report.uid is None)
    assert not result.timed_out and not result.stdout_truncated


def test_the_reported_layer_is_the_one_that_ran(sandbox, data_dir):
    """Each layer leaves its own marks: a pid namespace, a seccomp filter, a Landlock wall."""
    outside = data_dir / "open-to-all"
    outside.mkdir(exist_ok=True)
    os.chmod(outside, 0o777)
    target = outside / f"mark-{uuid.uuid4().hex}"
    script = (
        "readlink /proc/self/ns/pid; grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; "
        f"(echo x > {target}) 2>/dev/null && echo WROTE-OUTSIDE; true"
    )
    result = run(sandbox, script)
    lines = result.stdout.splitlines()
    own_pid_namespace = lines[0] != os.readlink("/proc/self/ns/pid")
    status = dict(line.split(":\t") for line in lines[1:3])
    wrote = "WROTE-OUTSIDE" in result.stdout
    assert status["NoNewPrivs"] == "1"
    if sandbox.level == "bubblewrap":
        assert own_pid_namespace and not wrote
        assert status["Seccomp"] == ("2" if platform.machine() in kernel.ARCHES else "0")
    elif sandbox.level == "landlock":
        assert not own_pid_namespace and not wrote and status["Seccomp"] == "2"
    else:
        assert not own_pid_namespace and status["Seccomp"] == "0" and wrote


def test_commands_run_as_an_unprivileged_uid_with_rlimits(sandbox):
    needs_uid_drop(sandbox.report)
    result = run(sandbox, "id -u; ulimit -u; ulimit -n; ulimit -c", agent_id=5999)
    assert result.stdout.split() == [str(agent_uid(5999)), "256", "256", "0"]


def test_a_timeout_kills_the_whole_tree_including_a_setsid_grandchild(sandbox):
    needs_uid_drop(sandbox.report)
    agent_id = next(_agent_ids)
    script = (
        "setsid sh -c 'trap \"\" TERM HUP INT; while :; do date +%s%N > beat; sleep 0.05; done' "
        "</dev/null >/dev/null 2>&1 & "
        "echo started; sleep 300"
    )
    started = time.monotonic()
    result = run(sandbox, script, agent_id=agent_id, timeout_s=1)
    elapsed = time.monotonic() - started
    assert result.timed_out and result.stdout == "started\n"
    assert elapsed < 5, elapsed
    deadline = time.monotonic() + 2
    while uid_processes(agent_uid(agent_id)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert uid_processes(agent_uid(agent_id)) == []
    beat = workspace_of(sandbox, agent_id) / "beat"
    assert beat.exists(), "the grandchild never ran, so this test proved nothing"
    before = beat.read_text()
    time.sleep(0.3)
    assert beat.read_text() == before


def test_processes_left_behind_are_killed_when_the_command_ends(sandbox):
    needs_uid_drop(sandbox.report)
    agent_id = next(_agent_ids)
    result = run(sandbox, "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo done", agent_id=agent_id)
    assert result.stdout == "done\n" and not result.timed_out
    deadline = time.monotonic() + 2
    while uid_processes(agent_uid(agent_id)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert uid_processes(agent_uid(agent_id)) == []


def test_one_agents_timeout_does_not_touch_another_agents_command(sandbox):
    import threading

    other = {}
    thread = threading.Thread(target=lambda: other.update(result=run(sandbox, "sleep 2; echo survived")))
    thread.start()
    time.sleep(0.3)
    assert run(sandbox, "sleep 30", timeout_s=1).timed_out
    thread.join(timeout=30)
    assert other["result"].stdout == "survived\n" and other["result"].exit_code == 0


def test_output_over_the_budget_is_truncated_and_marked(sandbox):
    result = run(sandbox, "head -c 3000000 /dev/zero | tr '\\0' a; head -c 1500000 /dev/zero | tr '\\0' b >&2")
    assert result.exit_code == 0 and not result.timed_out
    assert result.stdout == "a" * MiB and result.stdout_truncated and result.stdout_bytes == 3_000_000
    assert result.stderr == "b" * MiB and result.stderr_truncated and result.stderr_bytes == 1_500_000


def test_output_within_the_budget_is_whole(sandbox):
    result = run(sandbox, f"head -c {MiB} /dev/zero | tr '\\0' c")
    assert result.stdout == "c" * MiB and not result.stdout_truncated


def test_writes_outside_the_workspace_fail(sandbox, data_dir):
    needs_uid_drop(sandbox.report)
    root_only = data_dir / "root-only"
    root_only.mkdir(exist_ok=True)
    open_to_all = data_dir / "open-to-all"
    open_to_all.mkdir(exist_ok=True)
    os.chmod(open_to_all, 0o777)
    name = uuid.uuid4().hex
    script = f"echo x > {root_only}/{name}; echo x > /etc/{name}; echo ok > inside.txt; cat inside.txt"
    if sandbox.level != "rlimits":
        script += f"; echo x > {open_to_all}/{name}"
    result = run(sandbox, script)
    assert result.stdout == "ok\n"
    assert not (root_only / name).exists() and not Path(f"/etc/{name}").exists()
    if sandbox.level != "rlimits":
        # The Landlock and bubblewrap walls hold even where file permissions would let the write through.
        assert not (open_to_all / name).exists()


def test_tmp_is_private_under_bubblewrap(sandbox):
    if sandbox.level != "bubblewrap":
        pytest.skip("only bubblewrap gives a command a /tmp of its own")
    name = uuid.uuid4().hex
    assert run(sandbox, f"echo x > /tmp/{name} && cat /tmp/{name}").stdout == "x\n"
    assert not Path(f"/tmp/{name}").exists()


def test_the_network_is_unreachable(sandbox, data_dir):
    if sandbox.level == "rlimits":
        pytest.skip("the rlimits layer has no network wall; landlock and bubblewrap have")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    unix_dir = data_dir / "unix"
    unix_dir.mkdir(exist_ok=True)
    os.chmod(unix_dir, 0o755)
    unix_path = unix_dir / f"{uuid.uuid4().hex[:8]}.sock"
    unix_listener = socket.socket(socket.AF_UNIX)
    unix_listener.bind(str(unix_path))
    os.chmod(unix_path, 0o777)
    unix_listener.listen()
    unix_listener.setblocking(False)
    code = (
        "import socket\n"
        f"for family, address in ((socket.AF_INET, ('127.0.0.1', {port})), (socket.AF_UNIX, {str(unix_path)!r})):\n"
        "    try:\n"
        "        s = socket.socket(family); s.settimeout(2); s.connect(address); print('CONNECTED', family)\n"
        "    except OSError as exc:\n"
        "        print('refused', exc.errno)\n"
    )
    try:
        result = run(sandbox, code, language="python3")
        shell = run(sandbox, f"(echo ping > /dev/tcp/127.0.0.1/{port}) && echo CONNECTED")
        for server in (listener, unix_listener):
            with pytest.raises(BlockingIOError):
                server.accept()
    finally:
        listener.close()
        unix_listener.close()
    assert "CONNECTED" not in result.stdout and result.stdout.count("refused 1") == 2, result
    assert "CONNECTED" not in shell.stdout and shell.exit_code != 0


def test_the_environment_carries_no_secrets(sandbox, monkeypatch):
    monkeypatch.setenv("ALEPH_TEST_SECRET", "hunter2-in-the-server-environment")
    monkeypatch.setenv("DATABASE_URL", "postgres://admin:hunter2@db/aleph")
    result = run(sandbox, "env")
    assert "hunter2" not in result.stdout
    names = {line.split("=", 1)[0] for line in result.stdout.splitlines() if "=" in line}
    assert names <= {"PATH", "HOME", "TMPDIR", "LANG", "TERM", "PWD", "SHLVL", "_"}, names


def test_the_servers_environment_is_not_readable_through_proc(sandbox, monkeypatch):
    needs_uid_drop(sandbox.report)
    monkeypatch.setenv("ALEPH_TEST_SECRET", "hunter2-in-the-server-environment")
    result = run(sandbox, f"cat /proc/{os.getpid()}/environ /proc/{os.getppid()}/environ /proc/1/environ; true")
    assert "hunter2" not in result.stdout


def test_the_servers_data_directory_is_out_of_reach(sandbox, data_dir):
    if sandbox.level == "rlimits":
        pytest.skip("the rlimits layer hides nothing beyond file permissions")
    secret = data_dir / "readable-secret"
    secret.write_text("server-only")
    os.chmod(secret, 0o644)
    result = run(sandbox, f"cat {secret}")
    assert "server-only" not in result.stdout


def test_exit_codes_follow_the_shell_convention(sandbox):
    assert run(sandbox, "exit 3").exit_code == 3
    assert run(sandbox, "kill -9 $$").exit_code == 137


def test_a_working_dir_inside_the_workspace(sandbox):
    agent_id = next(_agent_ids)
    run(sandbox, "mkdir -p sub/deeper && ln -s / escape", agent_id=agent_id)
    result = run(sandbox, "pwd", agent_id=agent_id, working_dir="sub/deeper")
    assert result.stdout.strip() == f"{workspace_of(sandbox, agent_id)}/sub/deeper"
    for bad in ("../", "/etc", "escape", "missing"):
        with pytest.raises(SandboxRefused) as refused:
            run(sandbox, "pwd", agent_id=agent_id, working_dir=bad)
        assert refused.value.code == "bad_working_dir"


def test_code_runs_in_each_language_installed(sandbox):
    assert run(sandbox, "print(6 * 7)", language="python3").stdout == "42\n"
    assert run(sandbox, "echo $((6 * 7))", language="bash").stdout == "42\n"
    if "node" in sandbox.languages():
        assert run(sandbox, "console.log(6 * 7)", language="node").stdout == "42\n"
    else:
        with pytest.raises(SandboxRefused, match="node is not installed"):
            run(sandbox, "console.log(1)", language="node")


def test_the_floor_runs_again_inside_the_sandbox(sandbox):
    agent_id = next(_agent_ids)
    with pytest.raises(SandboxRefused) as refused:
        run(sandbox, "touch marker; rm -rf /", agent_id=agent_id)
    assert refused.value.code == "command_blocked"
    assert refused.value.detail["rule"] == "command_policy:rm_critical"
    assert not (workspace_of(sandbox, agent_id) / "marker").exists()


def test_workspaces_are_private_to_their_agent(sandbox):
    needs_uid_drop(sandbox.report)
    first, second = next(_agent_ids), next(_agent_ids)
    run(sandbox, "echo mine > note.txt", agent_id=first)
    result = run(sandbox, f"cat {workspace_of(sandbox, first)}/note.txt", agent_id=second)
    assert "mine" not in result.stdout and result.exit_code != 0
    info = os.stat(workspace_of(sandbox, first))
    assert (info.st_uid, info.st_mode & 0o777) == (agent_uid(first), 0o700)


# -- no builtin tool starts a process itself --------------------------------------------------------------------------

FORBIDDEN_CALLS = {("os", "system"), ("os", "popen"), ("os", "fork"), ("os", "forkpty"), ("pty", "spawn")}
FORBIDDEN_PREFIXES = {("os", "exec"), ("os", "spawn"), ("os", "posix_spawn")}


def process_starts(source: str) -> list[str]:
    """Every import of subprocess (or pty) and every os.system/os.exec*/os.spawn*/pty.spawn in the source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in ("subprocess", "pty")]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.split(".")[0] in ("subprocess", "pty"):
                found.append(f"from {module}")
            if module == "os":
                found += [
                    f"from os import {a.name}"
                    for a in node.names
                    if ("os", a.name) in FORBIDDEN_CALLS or any(a.name.startswith(p) for _, p in FORBIDDEN_PREFIXES)
                ]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            pair = (node.value.id, node.attr)
            if pair in FORBIDDEN_CALLS or any(
                node.value.id == m and node.attr.startswith(p) for m, p in FORBIDDEN_PREFIXES
            ):
                found.append(f"{node.value.id}.{node.attr}")
    return found


def test_the_scanner_catches_every_way_of_starting_a_process():
    for snippet in (
        "import subprocess",
        "from subprocess import run",
        "import os\nos.system('x')",
        "import os\nos.execvp('x', [])",
        "import os\nos.spawnl(0, 'x')",
        "import pty\npty.spawn('x')",
        "from os import execv",
        "import os\nos.posix_spawn('x', [], {})",
    ):
        assert process_starts(snippet), snippet
    assert process_starts("import os\nos.open('x', 0)") == []


def test_no_builtin_tool_starts_a_process_itself():
    builtin = Path(__file__).resolve().parent.parent / "tools_app" / "builtin"
    modules = sorted(builtin.glob("*.py"))
    assert {"exec.py", "files.py"} <= {m.name for m in modules}
    offenders = {m.name: process_starts(m.read_text()) for m in modules}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_a_later_agent_of_the_same_name_gets_a_fresh_workspace(report, data_dir):
    sandbox = WorkspaceSandbox(data_dir=data_dir, policy=CommandPolicy(), report=report)
    first = sandbox.workspace(agent_id=7001, agent_name="twin")
    (first.path / "diary.txt").write_text("the first twin's")
    second = sandbox.workspace(agent_id=7002, agent_name="twin")
    assert second.path != first.path and list(second.path.iterdir()) == []
    assert sandbox.workspace(agent_id=7001, agent_name="twin").path == first.path


def test_start_honours_the_minimum_level_and_health_says_so(monkeypatch, data_dir, report):
    """What wiring does with ALEPH_SANDBOX_MIN_LEVEL: probe, refuse below the minimum, and say why in health."""
    if report.level == "bubblewrap":
        monkeypatch.setattr("tools_app.sandbox.probe.LAYERS", {**_layers(), "bubblewrap": _Broken})
    sandbox = WorkspaceSandbox.start(data_dir=data_dir, min_level="bubblewrap")
    health = sandbox.health()
    assert (health["status"], health["degraded"]) == ("refused", True)
    assert health["level"] == sandbox.level != "bubblewrap"
    assert any(r.startswith("bubblewrap: ") for r in health["reasons"])
    with pytest.raises(SandboxRefused) as refused:
        run(sandbox, "echo hi")
    assert refused.value.code == "sandbox_unavailable"
    assert WorkspaceSandbox.start(data_dir=data_dir, min_level="rlimits").health()["status"] != "refused"
