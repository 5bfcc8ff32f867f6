"""Tampering with a chain in the database: `ledger verify` and the offline script both name the same breaks."""

import base64
import hashlib
import json
import uuid

import pytest
from nacl.signing import SigningKey

from ledger_app.entries import TAG, canonical, entry_digest, strict_loads
from ledger_app.models import AgentKey, ChainHead, LedgerEntry
from ledger_app.services import Event, _signer, key_rotate, ledger_append
from tests.ledger_support import export_to, kinds, ledger_command, run_script, sql, tampering

TARGET = 6
ENTRY_COLUMNS = ("body", "hash", "signature", "time", "action", "tool", "outcome", "principal", "signer")


def _event(i: int) -> Event:
    outcome = ("ok", "error", "denied")[i % 3]
    action = "tool_denied" if outcome == "denied" else "tool_call"
    return Event(
        action=action,
        outcome=outcome,
        tool="note_write",
        args_sha256=hashlib.sha256(str(i).encode()).hexdigest(),
        detail={"channel": "ops", "rule": "tier:ask", "i": i},
        call=str(uuid.uuid4()),
    )


@pytest.fixture
def chains(cast):
    """builder: identity (1), two events, a key rotation (4), five events (5-9); scout: identity and six events."""
    builder, scout = cast.builder.agent, cast.scout.agent
    for i in range(2, 4):
        ledger_append(agent_id=builder.id, event=_event(i))
    key_rotate(agent=builder, principal="admin")
    for i in range(5, 10):
        ledger_append(agent_id=builder.id, event=_event(i))
    for i in range(2, 8):
        ledger_append(agent_id=scout.id, event=_event(i))
    return builder, scout


def _row(agent, seq):
    return LedgerEntry.objects.filter(agent=agent, seq=seq).values(*ENTRY_COLUMNS).get()


def _write(agent, seq, **columns):
    assignments = ", ".join(f"{name} = %s" for name in columns)
    sql(
        f"UPDATE ledger_app_ledgerentry SET {assignments} WHERE agent_id = %s AND seq = %s",
        [*columns.values(), agent.id, seq],
    )


def _signed(body: dict, key: SigningKey) -> dict:
    data = canonical(body)
    digest = entry_digest(data)
    return {
        "body": data.decode(),
        "hash": digest.hex(),
        "signature": base64.b64encode(key.sign(digest).signature).decode(),
        "signer": body["signer"],
        "outcome": body["outcome"],
    }


def _scout_key(scout) -> SigningKey:
    key = AgentKey.objects.get(agent=scout, status="active")
    return _signer(key.id, key.fingerprint)


def field_edited(builder, scout):
    row = _row(builder, TARGET)
    _write(builder, TARGET, body=row["body"].replace('"outcome":"ok"', '"outcome":"error"'), outcome="error")


def edited_and_rehashed(builder, scout):
    body = strict_loads(_row(builder, TARGET)["body"])
    body["outcome"] = "error"
    data = canonical(body)
    _write(builder, TARGET, body=data.decode(), hash=hashlib.sha256(TAG + data).hexdigest(), outcome="error")


def resigned_with_foreign_key(builder, scout):
    key = _scout_key(scout)
    body = strict_loads(_row(builder, TARGET)["body"])
    body.update(outcome="error", signer=hashlib.sha256(bytes(key.verify_key)).hexdigest())
    _write(builder, TARGET, **_signed(body, key))


def middle_entry_deleted(builder, scout):
    sql("DELETE FROM ledger_app_ledgerentry WHERE agent_id = %s AND seq = %s", [builder.id, TARGET])


def two_entries_swapped(builder, scout):
    first, second = _row(builder, TARGET), _row(builder, TARGET + 1)
    _write(builder, TARGET, **second)
    _write(builder, TARGET + 1, **first)


def entry_inserted(builder, scout):
    """A made-up entry between 5 and 6, linked to 5; the database's fork guard makes its prev_hash column differ."""
    for seq in range(9, TARGET - 1, -1):
        sql("UPDATE ledger_app_ledgerentry SET seq = seq + 1 WHERE agent_id = %s AND seq = %s", [builder.id, seq])
    before = strict_loads(_row(builder, TARGET - 1)["body"])
    forged = {**before, "seq": TARGET, "prev_hash": _row(builder, TARGET - 1)["hash"], "outcome": "ok"}
    forged.update(action="tool_call", tool="vault_store", detail={"forged": True})
    data = canonical(forged)
    row = {
        "body": data.decode(),
        "hash": entry_digest(data).hex(),
        "signature": base64.b64encode(b"\x01" * 64).decode(),
    }
    before_row = LedgerEntry.objects.get(agent=builder, seq=TARGET - 1)
    sql(
        "INSERT INTO ledger_app_ledgerentry (agent_id, seq, prev_hash, hash, signature, body, time, action, tool, "
        "outcome, principal, signer) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        [
            builder.id,
            TARGET,
            "f" * 64,
            row["hash"],
            row["signature"],
            row["body"],
            before_row.time,
            "tool_call",
            "vault_store",
            "ok",
            None,
            forged["signer"],
        ],
    )


def tail_truncated(builder, scout):
    sql("DELETE FROM ledger_app_ledgerentry WHERE agent_id = %s AND seq > %s", [builder.id, 7])
    last = LedgerEntry.objects.get(agent=builder, seq=7)
    ChainHead.objects.filter(agent=builder).update(seq=7, hash=last.hash)


def copied_from_another_chain(builder, scout):
    _write(builder, TARGET, **_row(scout, TARGET))


def forged_signature_bytes(builder, scout):
    raw = bytearray(base64.b64decode(_row(builder, TARGET)["signature"]))
    raw[10] ^= 0x40
    _write(builder, TARGET, signature=base64.b64encode(bytes(raw)).decode())


def signer_key_swapped(builder, scout):
    current = AgentKey.objects.get(agent=builder, status="active")
    foreign = AgentKey.objects.get(agent=scout, status="active")
    sql("UPDATE ledger_app_agentkey SET public_key = %s WHERE id = %s", [foreign.public_key, current.id])


def duplicate_json_key(builder, scout):
    row = _row(builder, TARGET)
    _write(builder, TARGET, body='{"outcome":"error",' + row["body"][1:])


def sequence_gap(builder, scout):
    """A writer that skipped a number: every link and signature is right, only the seq jumps."""
    ChainHead.objects.filter(agent=builder).update(seq=10)
    ledger_append(agent_id=builder.id, event=_event(11))


CASES = {
    "field_edited": (field_edited, {("edited", TARGET)}, None),
    "edited_and_rehashed": (edited_and_rehashed, {("bad_signature", TARGET), ("broken_link", TARGET + 1)}, None),
    "resigned_with_foreign_key": (
        resigned_with_foreign_key,
        {("unknown_signer", TARGET), ("broken_link", TARGET + 1)},
        None,
    ),
    "middle_entry_deleted": (middle_entry_deleted, {("sequence_gap", TARGET + 1), ("broken_link", TARGET + 1)}, None),
    "two_entries_swapped": (
        two_entries_swapped,
        {("sequence_gap", TARGET + 1), ("broken_link", TARGET + 1), ("out_of_order", TARGET)},
        None,
    ),
    "entry_inserted": (
        entry_inserted,
        {("bad_signature", TARGET), ("out_of_order", TARGET), ("broken_link", TARGET)},
        None,
    ),
    "tail_truncated": (tail_truncated, {("truncated", 8)}, 9),
    "copied_from_another_chain": (
        copied_from_another_chain,
        {("foreign_agent", TARGET), ("broken_link", TARGET), ("unknown_signer", TARGET)},
        None,
    ),
    "forged_signature_bytes": (forged_signature_bytes, {("bad_signature", TARGET)}, None),
    "signer_key_swapped": (signer_key_swapped, {("unknown_signer", 5)}, None),
    "duplicate_json_key": (duplicate_json_key, {("non_canonical", TARGET)}, None),
    "sequence_gap": (sequence_gap, {("sequence_gap", 11)}, None),
}


@pytest.mark.parametrize("case", CASES)
def test_tampering_is_found_by_ledger_verify_and_the_offline_script(chains, case, tmp_path):
    builder, scout = chains
    apply, expected, expect_seq = CASES[case]
    expect_args = []
    if expect_seq:
        head = LedgerEntry.objects.get(agent=builder, seq=expect_seq)
        expect_args = ["--expect-head", f"{head.seq}:{head.hash}"]
    with tampering():
        apply(builder, scout)

    database, database_ok = ledger_command("verify", "builder", *expect_args)
    export = export_to(tmp_path / "builder.json", "builder")
    offline, offline_exit = run_script(export, *expect_args)
    from_file, file_ok = ledger_command("verify", "--file", str(export), *expect_args)

    assert not database_ok and not file_ok and offline_exit == 1
    assert kinds(database) == expected, database["breaks"]
    assert kinds(offline) == expected, offline["breaks"]
    assert kinds(from_file) == expected, from_file["breaks"]
    scout_report, scout_ok = ledger_command("verify", "scout")
    assert scout_ok and scout_report["ok"], "tampering with builder's chain must not touch scout's"


def test_an_untouched_export_and_a_reserialised_one_verify(chains, tmp_path):
    builder, _ = chains
    report, ok = ledger_command("verify", "builder")
    assert ok and report["ok"] and report["entries"] == 9 and report["keys"] == 2
    export = export_to(tmp_path / "builder.json", "builder")
    offline, exit_code = run_script(export)
    assert exit_code == 0 and offline == {"agent": "builder", "ok": True, "entries": 9, "breaks": []}

    def reorder(value):
        if isinstance(value, dict):
            return {key: reorder(value[key]) for key in reversed(list(value))}
        if isinstance(value, list):
            return [reorder(item) for item in value]
        return value

    document = json.loads(export.read_text())
    shuffled = tmp_path / "reordered.json"
    shuffled.write_text(json.dumps(reorder(document), indent=4, ensure_ascii=True))
    assert shuffled.read_text() != export.read_text()
    assert json.loads(shuffled.read_text())["entries"][0] == document["entries"][0]
    assert list(json.loads(shuffled.read_text())["entries"][0]) != list(document["entries"][0])
    offline, exit_code = run_script(shuffled)
    from_file, file_ok = ledger_command("verify", "--file", str(shuffled))
    assert exit_code == 0 and offline["ok"] and offline["entries"] == 9
    assert file_ok and from_file["ok"]

    head = document["head"]
    offline, exit_code = run_script(export, "--expect-head", f"{head['seq']}:{head['hash']}")
    assert exit_code == 0 and offline["ok"]


def test_truncation_without_an_expected_head_is_caught_when_the_head_row_was_left(chains, tmp_path):
    builder, _ = chains
    with tampering():
        sql("DELETE FROM ledger_app_ledgerentry WHERE agent_id = %s AND seq > 7", [builder.id])
    database, ok = ledger_command("verify", "builder")
    offline, exit_code = run_script(export_to(tmp_path / "b.json", "builder"))
    assert not ok and exit_code == 1
    assert kinds(database) == kinds(offline) == {("truncated", 8)}


def test_a_rewound_head_hides_truncation_until_an_auditor_brings_the_head_they_wrote_down(chains, tmp_path):
    builder, _ = chains
    head = ChainHead.objects.get(agent=builder)
    with tampering():
        tail_truncated(builder, None)
    report, ok = ledger_command("verify", "builder")
    assert ok and report["ok"], "without an outside expectation a cleanly cut tail looks like a shorter chain"
    report, ok = ledger_command("verify", "builder", "--expect-head", f"{head.seq}:{head.hash}")
    assert not ok and kinds(report) == {("truncated", 8)}


def test_edited_index_columns_are_caught_in_the_database_while_the_signed_export_stays_true(chains, tmp_path):
    builder, _ = chains
    with tampering():
        _write(builder, TARGET, outcome="denied", principal="mallory")
    report, ok = ledger_command("verify", "builder")
    assert not ok and kinds(report) == {("edited", TARGET)}
    assert "index columns" in report["breaks"][0]["message"]
    offline, exit_code = run_script(export_to(tmp_path / "b.json", "builder"))
    assert exit_code == 0 and offline["ok"]


def test_non_canonical_stored_bytes_are_refused(chains):
    builder, _ = chains
    row = _row(builder, TARGET)
    with tampering():
        _write(builder, TARGET, body=row["body"].replace('"v":1', '"v": 1'))
    report, ok = ledger_command("verify", "builder")
    assert not ok and kinds(report) == {("non_canonical", TARGET)}


def test_verify_without_an_agent_checks_every_chain_and_fails_if_any_breaks(chains):
    builder, _ = chains
    reports, ok = ledger_command("verify")
    assert ok and {r["agent"] for r in reports} == {"builder", "scout"}
    with tampering():
        forged_signature_bytes(builder, None)
    reports, ok = ledger_command("verify")
    assert not ok and {r["agent"]: r["ok"] for r in reports} == {"builder": False, "scout": True}


def test_the_worked_example_in_the_format_document_verifies_with_both_verifiers(tmp_path, db):
    import re

    from tests.ledger_support import ROOT

    text = (ROOT / "docs" / "ledger-format.md").read_text()
    [block] = re.findall(r"```json\n(.*?)```", text, re.S)
    export = tmp_path / "example.json"
    export.write_text(block)
    offline, code = run_script(export)
    assert code == 0 and offline["ok"] and offline["entries"] == 2
    from_file, ok = ledger_command("verify", "--file", str(export))
    assert ok and from_file["ok"]
    shown = re.findall(r"```\naleph-ledger/v1\n(.*?)\n```", text, re.S)
    hashes = re.findall(r"^hash `([0-9a-f]{64})`", text, re.M)
    assert len(shown) == 2 and [hashlib.sha256(TAG + s.encode()).hexdigest() for s in shown] == hashes
    tampered = tmp_path / "tampered.json"
    tampered.write_text(block.replace('"ops"', '"lab"'))
    offline, code = run_script(tampered)
    assert code == 1 and kinds(offline) == {("edited", 2)}


def test_the_offline_script_refuses_what_is_not_an_export(tmp_path):
    import subprocess
    import sys

    from tests.ledger_support import SCRIPT

    path = tmp_path / "not.json"
    for text in ('{"format": "something-else", "version": 1}', "[1, 2]", "{not json"):
        path.write_text(text)
        done = subprocess.run([sys.executable, "-I", str(SCRIPT), str(path)], capture_output=True, text=True)
        assert done.returncode == 2 and "unreadable export" in done.stderr
