"""manage.py sandbox_check: the start-up probe on demand, for operators and CI logs."""

import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from tools_app.sandbox import sandbox_probe


class Command(BaseCommand):
    help = "Probe every sandbox layer by really running it; report the one in use and why stronger ones fail."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print the report as JSON (what /api/v1/health/ shows)")

    def handle(self, *args, **options):
        report = sandbox_probe(data_dir=Path(settings.DATA_DIR), min_level=settings.SANDBOX_MIN_LEVEL)
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
        else:
            self.stdout.write(f"sandbox level: {report.level} ({report.status})")
            for check in report.checks:
                verdict = "works" if check.ok else f"fails: {check.reason}"
                self.stdout.write(f"  {check.level:<11} {verdict}  [{check.ms:.0f} ms]")
            if report.uid is None:
                self.stdout.write(f"  uid: {report.uid_reason}")
            else:
                self.stdout.write(f"  uid: commands run as unprivileged uids from {report.uid}")
            for reason in report.reasons:
                self.stdout.write(f"  why not stronger: {reason}")
        if report.status in ("refused", "unavailable"):
            raise CommandError(" ".join(report.reasons) or "no sandbox layer works here")
