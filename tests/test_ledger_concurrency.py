"""Eight writers append 500 entries each to one agent's chain at once: no fork, no gap, and the chain verifies."""

import json
import threading
import time

import pytest
from django.db import connection, connections, transaction

from ledger_app import services
from ledger_app.models import ChainHead, LedgerEntry
from ledger_app.services import Event, ledger_append
from tests.ledger_support import ledger_command, require_postgresql
from tools_app.services import agent_create

WRITERS, APPENDS = 8, 500


def _writer(agent_id: int, writer: int, start: threading.Barrier, errors: list) -> None:
    try:
        start.wait()
        for i in range(APPENDS):
            with transaction.atomic():
                event = Event(action="tool_call", outcome="ok", tool="note_write", detail={"writer": writer, "i": i})
                ledger_append(agent_id=agent_id, event=event)
    except Exception as exc:  # reported by the test, which must see every writer's failure
        errors.append(exc)
    finally:
        connections.close_all()


def _eight_writers_on_one_chain() -> float:
    agent, _ = agent_create(name="busy")
    errors: list = []
    start = threading.Barrier(WRITERS)
    threads = [threading.Thread(target=_writer, args=(agent.id, w, start, errors)) for w in range(WRITERS)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    elapsed = time.monotonic() - began
    assert not errors, errors[:3]
    assert not any(thread.is_alive() for thread in threads)

    rows = list(LedgerEntry.objects.filter(agent=agent).order_by("seq").values_list("seq", "prev_hash", "hash", "body"))
    total = 1 + WRITERS * APPENDS
    assert [seq for seq, *_ in rows] == list(range(1, total + 1)), "a gap or a duplicate seq"
    assert rows[0][1] == "0" * 64
    assert all(rows[i][1] == rows[i - 1][2] for i in range(1, len(rows))), (
        "a fork: an entry not linked to the one before"
    )
    assert len({h for _, _, h, _ in rows}) == total
    head = ChainHead.objects.get(agent=agent)
    assert (head.seq, head.hash) == (total, rows[-1][2])
    seen = {w: -1 for w in range(WRITERS)}
    for *_, body in rows[1:]:
        detail = json.loads(body)["detail"]
        assert detail["i"] == seen[detail["writer"]] + 1, "one writer's appends out of their order"
        seen[detail["writer"]] = detail["i"]
    report, ok = ledger_command("verify", "busy", "--expect-head", f"{head.seq}:{head.hash}")
    assert ok and report["ok"] and report["entries"] == total
    return elapsed


@pytest.mark.django_db(transaction=True)
def test_eight_writers_on_sqlite():
    if connection.vendor != "sqlite":
        pytest.skip("this run's database is PostgreSQL (DATABASE_URL is set); the SQLite variant runs without it")
    elapsed = _eight_writers_on_one_chain()
    print(f"sqlite: {WRITERS}x{APPENDS} appends in {elapsed:.1f}s = {WRITERS * APPENDS / elapsed:.0f}/s")


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_eight_writers_on_postgresql():
    require_postgresql()
    elapsed = _eight_writers_on_one_chain()
    print(f"postgresql: {WRITERS}x{APPENDS} appends in {elapsed:.1f}s = {WRITERS * APPENDS / elapsed:.0f}/s")


@pytest.mark.django_db
def test_a_writer_that_read_a_stale_head_inserts_nothing(monkeypatch):
    """The compare on seq stays behind the row lock: a writer holding a stale head (as if it forgot the lock) is
    refused and adds no entry, on either database."""
    agent, _ = agent_create(name="careless")
    ledger_append(agent_id=agent.id, event=Event(action="tool_call", outcome="ok", tool="note_write"))
    locked_read = services._head_lock

    def stale(*args):
        seq, *rest = locked_read(*args)
        return (seq - 1, *rest)

    monkeypatch.setattr(services, "_head_lock", stale)
    with pytest.raises(services.LedgerError, match="moved"), transaction.atomic():
        ledger_append(agent_id=agent.id, event=Event(action="tool_call", outcome="ok", tool="note_write"))
    assert list(LedgerEntry.objects.filter(agent=agent).values_list("seq", flat=True).order_by("seq")) == [1, 2]
    assert ChainHead.objects.get(agent=agent).seq == 2
