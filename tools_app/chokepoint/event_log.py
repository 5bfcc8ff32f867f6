"""Writing a finished call's event-log row: the statement save() would send, built once per database.

Every call writes one row, and save() compiling the INSERT anew each time cost more than the database's own work.
On SQLite a row that needs no transaction (a read that ran: nothing to sign) can also be written without leaving the
event loop: a thread hop costs more than the INSERT itself (about 0.15-0.25 ms here against 0.1 ms).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sqlite3
import threading
from typing import Any

from django.db import connections, router

from ..models import ToolCall

logger = logging.getLogger(__name__)

# The loop's connection never checkpoints (a checkpoint fsyncs); every so many rows one runs in a worker thread.
CHECKPOINT_EVERY = 500


def _columns(alias: str, placeholder: str) -> str:
    quote = connections[alias].ops.quote_name
    fields = ToolCall._meta.concrete_fields
    columns = ", ".join(quote(f.column) for f in fields)
    values = ", ".join([placeholder] * len(fields))
    # Only the model's own table and column names go into the text; every value is a parameter.
    return f"INSERT INTO {quote(ToolCall._meta.db_table)} ({columns}) VALUES ({values})"  # noqa: S608


@functools.cache
def _insert_sql(alias: str) -> str:
    return _columns(alias, "%s")


@functools.cache
def _insert_sql_qmark(alias: str) -> str:
    return _columns(alias, "?")


def _params(call: ToolCall, alias: str) -> list[Any]:
    connection = connections[alias]
    return [field.get_db_prep_save(field.pre_save(call, True), connection) for field in ToolCall._meta.concrete_fields]


def _written(call: ToolCall, alias: str) -> None:
    call._state.adding = False
    call._state.db = alias


def insert(call: ToolCall) -> None:
    """A new event-log row through Django's connection of this thread. Sends no save signals (ToolCall has none)."""
    alias = router.db_for_write(ToolCall, instance=call)
    with connections[alias].cursor() as cursor:
        cursor.execute(_insert_sql(alias), _params(call, alias))
    _written(call, alias)


class _LoopDatabase:
    """One SQLite connection for one event-loop thread: it never waits for a lock and never fsyncs."""

    def __init__(self, path: str, init_command: str):
        self.path = path
        self.inode = os.stat(path).st_ino
        self.db = sqlite3.connect(path, isolation_level=None, timeout=0)
        if init_command:
            self.db.executescript(init_command)
        self.db.executescript("PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 0; PRAGMA wal_autocheckpoint = 0;")
        journal = self.db.execute("PRAGMA journal_mode").fetchone()[0]
        synchronous = self.db.execute("PRAGMA synchronous").fetchone()[0]
        # Anything else would wait on the loop: a rollback journal blocks on readers, FULL fsyncs every commit.
        self.usable = journal == "wal" and synchronous <= 1
        self.rows = 0

    def current(self, path: str) -> bool:
        """Still the database file the settings name (a test run recreates it under the same name)."""
        try:
            return path == self.path and os.stat(path).st_ino == self.inode
        except OSError:
            return False

    def close(self) -> None:
        self.db.close()


_local = threading.local()
_checkpoints: set[asyncio.Future] = set()
_inherited: list[_LoopDatabase] = []


def _forget_after_fork() -> None:
    """A forked child (a test's daphne) must not use its parent's SQLite connection, nor close it: closing may
    checkpoint or drop the WAL under the parent. It is kept, unused, for the child's life."""
    held = getattr(_local, "database", None)
    if held is not None:
        _inherited.append(held)
        _local.database = None


os.register_at_fork(after_in_child=_forget_after_fork)


def _loop_database(alias: str) -> _LoopDatabase | None:
    connection = connections[alias]
    if connection.vendor != "sqlite" or connection.is_in_memory_db():
        return None
    path = str(connection.settings_dict["NAME"])
    held: _LoopDatabase | None = getattr(_local, "database", None)
    if held is not None and held.current(path):
        return held if held.usable else None
    if held is not None:
        held.close()
    try:
        held = _LoopDatabase(path, connection.settings_dict.get("OPTIONS", {}).get("init_command", ""))
    except (OSError, sqlite3.Error):
        _local.database = None
        return None
    _local.database = held
    return held if held.usable else None


def _checkpoint(path: str) -> None:
    db = sqlite3.connect(path, timeout=5)
    try:
        db.execute("PRAGMA wal_checkpoint(PASSIVE)")
    finally:
        db.close()


def _checkpoint_done(future: asyncio.Future) -> None:
    _checkpoints.discard(future)
    if not future.cancelled() and future.exception() is not None:
        logger.warning("event-log WAL checkpoint failed: %s", future.exception())


def insert_from_loop(call: ToolCall) -> bool:
    """Write a row that needs no transaction from the event loop's own thread, if that cannot block it: SQLite in WAL
    mode, a connection of this thread's own that fails at once (busy_timeout 0) rather than wait while another writer
    holds the lock. False when the row must go the ordinary way: another database, a held lock, any SQLite error
    (the ordinary way then meets the same error through Django and reports it as it always does)."""
    alias = router.db_for_write(ToolCall, instance=call)
    held = _loop_database(alias)
    if held is None:
        return False
    try:
        held.db.execute(_insert_sql_qmark(alias), _params(call, alias))
    except sqlite3.Error:
        return False
    _written(call, alias)
    held.rows += 1
    if held.rows >= CHECKPOINT_EVERY:
        held.rows = 0
        future = asyncio.get_running_loop().run_in_executor(None, _checkpoint, held.path)
        _checkpoints.add(future)
        future.add_done_callback(_checkpoint_done)
    return True
