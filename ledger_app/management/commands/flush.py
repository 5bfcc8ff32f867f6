"""Django's flush, which on SQLite first lifts the ledger's append-only triggers and puts them back after."""

from django.core.management.commands import flush
from django.db import connections, transaction

from ledger_app.guards import sqlite_guards_create, sqlite_guards_drop


class Command(flush.Command):
    help = flush.Command.help + " The ledger's append-only triggers are lifted for the flush only (SQLite)."

    def handle(self, **options):
        connection = connections[options["database"]]
        if connection.vendor != "sqlite":
            # PostgreSQL flushes with TRUNCATE, which row triggers do not see.
            return super().handle(**options)
        with transaction.atomic(using=options["database"]):
            with connection.cursor() as cursor:
                lifted = sqlite_guards_drop(cursor)
            super().handle(**options)
            with connection.cursor() as cursor:
                sqlite_guards_create(cursor, lifted)
