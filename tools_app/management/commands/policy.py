import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from tools_app.policy_toml import policy_export, policy_import
from tools_app.services import ApplicationError


class Command(BaseCommand):
    help = "Policy as code: `policy import FILE` (all-or-nothing) and `policy export`."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        load = sub.add_parser("import", help="make the stored policy exactly this file's")
        load.add_argument("file", help="an aleph.toml, or - for standard input")
        sub.add_parser("export", help="print the current policy as aleph.toml")

    def handle(self, *args, **options):
        if options["action"] == "export":
            self.stdout.write(policy_export(), ending="")
            return
        path = options["file"]
        try:
            text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {path}: {exc}") from None
        try:
            summary = policy_import(text=text)
        except ApplicationError as exc:
            raise CommandError(f"{path}: {exc.message} (nothing was changed)") from None
        self.stdout.write(
            f"Imported {path}: {summary['entries']} permission entries ({summary['removed_entries']} removed), "
            f"{summary['agents']} agents, {summary['channels']} channels."
        )
        for name, token in summary["new_agent_tokens"].items():
            self.stdout.write(f"New agent {name}; its API token, shown only this once: {token}")
