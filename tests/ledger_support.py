"""Helpers for the ledger suites: a database-owner's tampering, the two verifiers, PostgreSQL gating."""

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from ledger_app.guards import sqlite_guards_create, sqlite_guards_drop

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "verify_ledger_export.py"
SERVICES_REQUIRED = os.environ.get("ALEPH_REQUIRE_SERVICES") == "1"


def require_postgresql() -> None:
    """Skip (or, with ALEPH_REQUIRE_SERVICES=1, fail) unless this run's database is PostgreSQL."""
    if connection.vendor == "postgresql":
        return
    reason = "DATABASE_URL is unset: this run uses SQLite, so the PostgreSQL ledger test cannot run"
    if SERVICES_REQUIRED:
        pytest.fail(reason)
    pytest.skip(reason)


@contextlib.contextmanager
def tampering():
    """What someone who owns the database can do: lift the append-only triggers (inside the test's transaction)."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            lifted = sqlite_guards_drop(cursor)
        else:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # ALTER TABLE refuses to run with checks still pending
            cursor.execute("ALTER TABLE ledger_app_ledgerentry DISABLE TRIGGER USER")
            cursor.execute("ALTER TABLE ledger_app_agentkey DISABLE TRIGGER USER")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                sqlite_guards_create(cursor, lifted)
            else:
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
                cursor.execute("ALTER TABLE ledger_app_ledgerentry ENABLE TRIGGER USER")
                cursor.execute("ALTER TABLE ledger_app_agentkey ENABLE TRIGGER USER")


def sql(statement: str, params=()) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def ledger_command(*args: str) -> tuple[dict | list, bool]:
    """`ledger verify ... --json`: (the report, whether the command exited 0)."""
    out = io.StringIO()
    try:
        call_command("ledger", *args, "--json", stdout=out)
        ok = True
    except CommandError:
        ok = False
    return json.loads(out.getvalue()), ok


def export_to(path: Path, agent: str) -> Path:
    call_command("ledger", "export", agent, "-o", str(path), stderr=io.StringIO())
    return path


def run_script(path: Path, *args: str) -> tuple[dict, int]:
    """The independent verifier, in its own process, with nothing of the project importable."""
    done = subprocess.run(
        [sys.executable, "-I", str(SCRIPT), str(path), *args], capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout), done.returncode


def kinds(report: dict) -> set[tuple[str, int]]:
    return {(found["kind"], found["seq"]) for found in report["breaks"]}
