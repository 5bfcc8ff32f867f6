"""The event-log row of a read that ran: on SQLite it is written from the event loop, which it never blocks."""

import asyncio
import os
import sqlite3
import time

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from ledger_app.recorder import LedgerRecorder
from tools_app.chokepoint import event_log
from tools_app.chokepoint.base import MUTATING, READ_ONLY
from tools_app.chokepoint.registry import ToolRegistry
from tools_app.chokepoint.service import NoApprovalGate, ScopedToolService
from tools_app.gateway import turn_build
from tools_app.models import CallStatus, ToolCall
from tools_app.policy_store import current_policy

from .conftest import make_cast
from .test_policy_contract import fake_tool

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "sqlite", reason="the loop's own connection is for SQLite only"),
]


@pytest.fixture
def service(monkeypatch):
    cast = make_cast()
    registry = ToolRegistry()
    registry.register_all([fake_tool("reader", READ_ONLY), fake_tool("writer", MUTATING)])
    policy = current_policy()
    turn = turn_build(policy=policy, agent_id=cast.builder.agent.id, channel_name="ops", session_key=None)
    built = ScopedToolService(
        registry=registry.freeze(), policy=policy, turn=turn, gate=NoApprovalGate(), recorder=LedgerRecorder()
    )
    built.hops = []  # the calls whose row went through a worker thread
    write = built._write

    def spy(call, *args):
        built.hops.append(call.tool)
        write(call, *args)

    monkeypatch.setattr(built, "_write", spy)
    return built


def database_path() -> str:
    return str(connection.settings_dict["NAME"])


def stored(call_id: str) -> ToolCall | None:
    return ToolCall.objects.filter(pk=call_id).first()


async def test_a_read_that_ran_is_written_from_the_loop_before_the_result_returns(service):
    outcome = await service.execute("reader", {})
    assert outcome.status == CallStatus.SUCCEEDED
    row = await sync_to_async(stored)(outcome.id)
    assert row is not None and row.status == CallStatus.SUCCEEDED and row.output == {"ran": "reader"}
    assert row.verdict == "allow" and row.finished_at is not None
    assert service.hops == []


async def test_a_call_that_signs_an_entry_still_goes_through_one_transaction(service):
    outcome = await service.execute("writer", {})
    assert outcome.status == CallStatus.DENIED  # mutating asks under Ask, and nobody is there to answer
    assert service.hops == ["writer"]
    assert await sync_to_async(stored)(outcome.id) is not None


async def test_a_held_write_lock_sends_the_row_the_ordinary_way_and_the_loop_keeps_running(service):
    await service.execute("reader", {})  # the loop's connection is open before the lock is taken
    holder = sqlite3.connect(database_path(), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    gaps = []

    async def ticker():
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    call = asyncio.create_task(service.execute("reader", {}))
    await asyncio.sleep(0.4)
    assert not call.done()  # the row waits for the lock, in a worker thread
    holder.execute("ROLLBACK")
    holder.close()
    outcome = await asyncio.wait_for(call, 10)
    ticking.cancel()
    assert outcome.status == CallStatus.SUCCEEDED
    assert await sync_to_async(stored)(outcome.id) is not None
    assert service.hops == ["reader"]
    # A loop connection that waited on the lock would stall the loop for its whole busy timeout.
    assert max(gaps) < 1.0, f"the event loop stalled for {max(gaps):.3f} s"


async def test_the_loop_connection_never_checkpoints_a_worker_thread_does(service, monkeypatch):
    checkpointed = []
    monkeypatch.setattr(event_log, "CHECKPOINT_EVERY", 3)
    monkeypatch.setattr(event_log, "_checkpoint", checkpointed.append)
    await service.execute("reader", {})
    await asyncio.gather(*event_log._checkpoints)
    event_log._local.database.rows = 0  # this thread's connection, shared with earlier tests on this loop thread
    checkpointed.clear()
    for _ in range(7):
        await service.execute("reader", {})
    await asyncio.gather(*event_log._checkpoints)
    assert checkpointed == [database_path(), database_path()]
    assert service.hops == []


@pytest.mark.parametrize(
    ("init_command", "usable"),
    [
        ("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", True),
        ("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;", False),
        ("PRAGMA journal_mode=DELETE; PRAGMA synchronous=NORMAL;", False),
    ],
)
def test_only_a_database_that_cannot_stall_the_loop_is_written_from_it(tmp_path, init_command, usable):
    path = tmp_path / "events.sqlite3"
    sqlite3.connect(path).close()
    held = event_log._LoopDatabase(str(path), init_command)
    try:
        assert held.usable is usable
        assert held.db.execute("PRAGMA busy_timeout").fetchone()[0] == 0
        assert held.db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    finally:
        held.close()


def test_a_connection_to_a_removed_or_renamed_database_is_not_reused(tmp_path):
    path = tmp_path / "events.sqlite3"
    sqlite3.connect(path).close()
    held = event_log._LoopDatabase(str(path), "")
    try:
        assert held.current(str(path))
        assert not held.current(str(tmp_path / "other.sqlite3"))
        path.unlink()
        assert not held.current(str(path))
    finally:
        held.close()


async def test_a_forked_child_never_touches_its_parents_connection(service):
    await service.execute("reader", {})
    held = event_log._local.database
    pid = os.fork()
    if pid == 0:  # the child: the connection is set aside, neither used nor closed
        os._exit(0 if getattr(event_log._local, "database", None) is None and event_log._inherited[-1] is held else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert event_log._local.database is held
    assert (await service.execute("reader", {})).status == CallStatus.SUCCEEDED
