"""Database triggers that make ledger rows append-only: UPDATE and DELETE of an entry, DELETE of a key, are refused."""

from __future__ import annotations

SQLITE_TRIGGERS = {
    "ledger_entry_no_update": (
        "CREATE TRIGGER ledger_entry_no_update BEFORE UPDATE ON ledger_app_ledgerentry "
        "BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only: UPDATE refused'); END"
    ),
    "ledger_entry_no_delete": (
        "CREATE TRIGGER ledger_entry_no_delete BEFORE DELETE ON ledger_app_ledgerentry "
        "BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only: DELETE refused'); END"
    ),
    "ledger_key_no_delete": (
        "CREATE TRIGGER ledger_key_no_delete BEFORE DELETE ON ledger_app_agentkey "
        "BEGIN SELECT RAISE(ABORT, 'agent keys are never deleted: DELETE refused'); END"
    ),
    "ledger_key_frozen": (
        "CREATE TRIGGER ledger_key_frozen BEFORE UPDATE ON ledger_app_agentkey "
        "WHEN NEW.fingerprint IS NOT OLD.fingerprint OR NEW.public_key IS NOT OLD.public_key "
        "OR NEW.sealed_seed IS NOT OLD.sealed_seed OR NEW.agent_id IS NOT OLD.agent_id "
        "BEGIN SELECT RAISE(ABORT, 'an agent key cannot change: UPDATE refused'); END"
    ),
}

POSTGRESQL_FORWARD = [
    """
    CREATE OR REPLACE FUNCTION ledger_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'ledger rows are append-only: % on % refused', TG_OP, TG_TABLE_NAME
            USING ERRCODE = 'integrity_constraint_violation';
    END
    $$
    """,
    "CREATE TRIGGER ledger_entry_append_only BEFORE UPDATE OR DELETE ON ledger_app_ledgerentry "
    "FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change()",
    "CREATE TRIGGER ledger_key_no_delete BEFORE DELETE ON ledger_app_agentkey "
    "FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change()",
    "CREATE TRIGGER ledger_key_frozen BEFORE UPDATE ON ledger_app_agentkey FOR EACH ROW "
    "WHEN (NEW.fingerprint IS DISTINCT FROM OLD.fingerprint OR NEW.public_key IS DISTINCT FROM OLD.public_key "
    "OR NEW.sealed_seed IS DISTINCT FROM OLD.sealed_seed OR NEW.agent_id IS DISTINCT FROM OLD.agent_id) "
    "EXECUTE FUNCTION ledger_refuse_change()",
]

POSTGRESQL_REVERSE = [
    "DROP TRIGGER IF EXISTS ledger_key_frozen ON ledger_app_agentkey",
    "DROP TRIGGER IF EXISTS ledger_key_no_delete ON ledger_app_agentkey",
    "DROP TRIGGER IF EXISTS ledger_entry_append_only ON ledger_app_ledgerentry",
    "DROP FUNCTION IF EXISTS ledger_refuse_change()",
]


def sqlite_guards_drop(cursor) -> list[str]:
    """Drop the SQLite triggers (only `flush` does this, inside its transaction); returns those that existed."""
    cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'ledger_%'")
    present = [name for (name,) in cursor.fetchall() if name in SQLITE_TRIGGERS]
    for name in present:
        cursor.execute(f"DROP TRIGGER {name}")  # names come from SQLITE_TRIGGERS
    return present


def sqlite_guards_create(cursor, names: list[str]) -> None:
    for name in names:
        cursor.execute(SQLITE_TRIGGERS[name])
