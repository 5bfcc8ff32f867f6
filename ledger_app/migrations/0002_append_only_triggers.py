"""Triggers that refuse UPDATE and DELETE of ledger entries and DELETE (or rewriting) of agent keys, per vendor."""

from django.db import migrations

from ledger_app.guards import POSTGRESQL_FORWARD, POSTGRESQL_REVERSE, SQLITE_TRIGGERS


class VendorRunSQL(migrations.RunSQL):
    """RunSQL that only runs on one database vendor."""

    def __init__(self, vendor, sql, reverse_sql):
        super().__init__(sql, reverse_sql)
        self.vendor = vendor

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == self.vendor:
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == self.vendor:
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    dependencies = [("ledger_app", "0001_initial")]

    operations = [
        VendorRunSQL(
            "sqlite",
            list(SQLITE_TRIGGERS.values()),
            [f"DROP TRIGGER IF EXISTS {name}" for name in SQLITE_TRIGGERS],
        ),
        VendorRunSQL("postgresql", POSTGRESQL_FORWARD, POSTGRESQL_REVERSE),
    ]
