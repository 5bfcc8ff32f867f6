"""`ledger verify [AGENT] [--expect-head SEQ:HASH]`, `ledger export AGENT [-o FILE]`, `ledger rotate|revoke AGENT`."""

import json
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from ledger_app.entries import strict_loads
from ledger_app.models import ChainHead
from ledger_app.services import (
    chain_get,
    export_verify,
    key_revoke,
    key_rotate,
    ledger_export,
    ledger_verify,
    parse_expected_head,
)
from tools_app.services import ApplicationError


def _describe(report: dict) -> str:
    head = report["head"] or {}
    if report["ok"]:
        return f"OK     {report['agent']}: {report['entries']} entries, head {head.get('seq')}:{head.get('hash')}"
    lines = [f"BROKEN {report['agent']}: {report['entries']} entries"]
    for found in report["breaks"]:
        count = report["counts"].get(found["kind"], 1)
        lines.append(f"  {found['kind']:<15} first at seq {found['seq']} ({count}x): {found['message']}")
    return "\n".join(lines)


class Command(BaseCommand):
    help = "Verify, export and re-key the signed ledger. `verify` exits 0 only when every chain verifies."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        verify = sub.add_parser("verify", help="verify one chain, every chain, or an export file")
        verify.add_argument("agent", nargs="?")
        verify.add_argument("--expect-head", metavar="SEQ:HASH", help="the head an auditor wrote down earlier")
        verify.add_argument("--file", help="verify this export document instead of the database")
        verify.add_argument("--json", action="store_true", help="print the reports as JSON")
        export = sub.add_parser("export", help="write the self-contained, offline-verifiable export")
        export.add_argument("agent")
        export.add_argument("-o", "--output", help="file to write (default: standard output)")
        rotate = sub.add_parser("rotate", help="give the agent a new key, introduced by its old key")
        rotate.add_argument("agent")
        rotate.add_argument("--principal", help="the person doing it, recorded on the chain")
        revoke = sub.add_parser("revoke", help="revoke the agent's key and continue under a fresh one")
        revoke.add_argument("agent")
        revoke.add_argument("--reason", required=True)
        revoke.add_argument("--principal", help="the person doing it, recorded on the chain")

    def handle(self, *args, **options):
        try:
            return getattr(self, f"_{options['action']}")(options)
        except ApplicationError as exc:
            raise CommandError(exc.message) from None

    def _verify(self, options):
        expect = parse_expected_head(options["expect_head"])
        if options["file"]:
            try:
                document = strict_loads(Path(options["file"]).read_bytes())
            except (OSError, ValueError) as exc:
                raise CommandError(f"cannot read {options['file']}: {exc}") from None
            reports = [export_verify(document=document, expect_head=expect)]
        elif options["agent"]:
            reports = [ledger_verify(head=chain_get(name=options["agent"]), expect_head=expect)]
        else:
            if expect:
                raise CommandError("--expect-head needs an AGENT: a head belongs to one chain")
            heads = ChainHead.objects.select_related("agent").order_by("name")
            reports = [ledger_verify(head=head) for head in heads]
        if options["json"]:
            self.stdout.write(json.dumps(reports if len(reports) != 1 else reports[0], indent=1))
        else:
            for report in reports:
                self.stdout.write(_describe(report))
        broken = [r["agent"] for r in reports if not r["ok"]]
        if broken:
            raise CommandError(f"{len(broken)} of {len(reports)} chains do not verify: {', '.join(broken)}")

    def _export(self, options):
        chunks = ledger_export(head=chain_get(name=options["agent"]))
        if options["output"]:
            with open(options["output"], "w", encoding="utf-8") as handle:
                handle.writelines(chunks)
            self.stderr.write(f"wrote {options['output']}")
        else:
            for chunk in chunks:
                sys.stdout.write(chunk)

    def _rotate(self, options):
        head = chain_get(name=options["agent"])
        key = key_rotate(agent=head.agent, principal=options["principal"])
        self.stdout.write(f"{head.name} now signs with {key.fingerprint} ({key.public_key})")

    def _revoke(self, options):
        head = chain_get(name=options["agent"])
        key = key_revoke(agent=head.agent, reason=options["reason"], principal=options["principal"])
        self.stdout.write(f"revoked; {head.name} now signs with {key.fingerprint} ({key.public_key})")
