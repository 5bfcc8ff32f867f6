"""Keys, appends, the recorder's choice of entries, and the database refusing to rewrite history."""

import base64
import io
import json

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.test import Client
from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.exceptions import CryptoError
from nacl.secret import SecretBox
from nacl.signing import SigningKey

from ledger_app.entries import (
    arguments_sha256,
    b64e,
    canonical,
    detail_redact,
    key_fingerprint,
    strict_loads,
)
from ledger_app.models import AgentKey, ChainHead, LedgerEntry
from ledger_app.recorder import LedgerRecorder, call_events
from ledger_app.services import SEAL_PURPOSE, Event, key_revoke, key_rotate, ledger_append
from tests.conftest import client_for
from tests.ledger_support import ledger_command, sql
from tools_app.crypto import secret_box
from tools_app.models import Agent, CallStatus, ToolCall, ToolPermission
from tools_app.services import agent_create


def entries(agent) -> list[dict]:
    return [
        json.loads(body)
        for body in LedgerEntry.objects.filter(agent=agent).order_by("seq").values_list("body", flat=True)
    ]


def verified(name: str) -> dict:
    report, ok = ledger_command("verify", name)
    assert ok and report["ok"], report["breaks"]
    return report


# -- keys and identity --------------------------------------------------------------------------------------------


def test_every_agent_and_sub_agent_gets_its_own_key_and_identity_entry(cast):
    out = io.StringIO()
    call_command("agent", "create", "courier", "--parent", "builder", "--json", stdout=out)
    printed = json.loads(out.getvalue())
    courier = Agent.objects.get(name="courier")
    key = AgentKey.objects.get(agent=courier)
    assert printed["public_key"] == key.public_key and len(base64.b64decode(key.public_key)) == 32
    assert key.fingerprint == key_fingerprint(base64.b64decode(key.public_key))
    assert key.fingerprint != AgentKey.objects.get(agent=cast.builder.agent).fingerprint
    [identity] = entries(courier)
    assert identity["action"] == "identity_created" and identity["seq"] == 1
    assert identity["detail"] == {"public_key": key.public_key, "parent": "builder"}
    assert identity["signer"] == key.fingerprint and identity["prev_hash"] == "0" * 64
    verified("courier")


def test_the_seed_is_sealed_under_the_secret_key_and_never_stored_plain(cast):
    key = AgentKey.objects.get(agent=cast.builder.agent)
    sealed = bytes(key.sealed_seed)
    seed = secret_box(SEAL_PURPOSE).decrypt(sealed)
    assert bytes(SigningKey(seed).verify_key) == base64.b64decode(key.public_key)
    assert seed not in sealed
    with pytest.raises(CryptoError):
        SecretBox(b"\x00" * 32).decrypt(sealed)
    with pytest.raises(CryptoError):
        secret_box(b"aleph-vault").decrypt(sealed)


def test_the_admin_console_gives_a_new_agent_its_key(cast):
    browser = Client()
    browser.force_login(cast.admin.user)
    response = browser.post(
        "/admin/tools_app/agent/add/",
        {
            "name": "viaadmin",
            "is_active": "on",
            "exec_tier": "",
            "permissions-TOTAL_FORMS": "0",
            "permissions-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 302, response.content[:2000]
    agent = Agent.objects.get(name="viaadmin")
    assert AgentKey.objects.filter(agent=agent, status="active").count() == 1
    assert [e["action"] for e in entries(agent)] == ["identity_created"]


def test_an_agent_from_before_the_ledger_gets_its_identity_on_its_first_entry(cast):
    legacy = Agent.objects.create(name="legacy", token_hash="0" * 64)
    ledger_append(agent_id=legacy.id, event=Event(action="tool_call", outcome="ok", tool="note_write"))
    assert [e["action"] for e in entries(legacy)] == ["identity_created", "tool_call"]
    verified("legacy")


def test_rotation_links_old_and_new_and_revocation_retires_the_key(cast):
    builder = cast.builder.agent
    first = AgentKey.objects.get(agent=builder)
    second = key_rotate(agent=builder, principal="admin")
    ledger_append(agent_id=builder.id, event=Event(action="tool_call", outcome="ok", tool="note_write"))
    third = key_revoke(agent=builder, reason="seed copied to a laptop", principal="admin")
    ledger_append(agent_id=builder.id, event=Event(action="tool_call", outcome="ok", tool="note_write"))
    chain = entries(builder)
    assert [e["action"] for e in chain] == ["identity_created", "key_rotated", "tool_call", "key_revoked", "tool_call"]
    assert chain[1]["signer"] == first.fingerprint and chain[1]["detail"]["new_key"] == second.fingerprint
    assert chain[1]["detail"]["public_key"] == second.public_key and chain[1]["principal"] == "admin"
    assert chain[2]["signer"] == second.fingerprint
    assert chain[3]["signer"] == second.fingerprint and chain[3]["detail"]["revoked_key"] == second.fingerprint
    assert chain[4]["signer"] == third.fingerprint
    statuses = dict(AgentKey.objects.filter(agent=builder).values_list("fingerprint", "status"))
    assert statuses == {first.fingerprint: "rotated", second.fingerprint: "revoked", third.fingerprint: "active"}
    report = verified("builder")
    assert report["keys"] == 3 and report["active_key"] == third.fingerprint


def test_an_entry_signed_by_a_revoked_key_after_its_revocation_is_an_unknown_signer(cast):
    builder = cast.builder.agent
    revoked = AgentKey.objects.get(agent=builder)
    seed = secret_box(SEAL_PURPOSE).decrypt(bytes(revoked.sealed_seed))
    key_revoke(agent=builder, reason="leaked")
    head = ChainHead.objects.get(agent=builder)
    body = json.loads(LedgerEntry.objects.get(agent=builder, seq=head.seq).body)
    body.update(seq=head.seq + 1, prev_hash=head.hash, signer=revoked.fingerprint, action="tool_call", detail={})
    from ledger_app.entries import entry_digest

    data = canonical(body)
    digest = entry_digest(data)
    LedgerEntry.objects.create(
        agent=builder,
        seq=head.seq + 1,
        prev_hash=head.hash,
        hash=digest.hex(),
        signature=b64e(SigningKey(seed).sign(digest).signature),
        body=data.decode(),
        time=timezone.now().replace(microsecond=0),
        action="tool_call",
        outcome="ok",
        signer=revoked.fingerprint,
    )
    ChainHead.objects.filter(agent=builder).update(seq=head.seq + 1, hash=digest.hex())
    report, ok = ledger_command("verify", "builder")
    assert not ok
    unknown = next(b for b in report["breaks"] if b["kind"] == "unknown_signer")
    assert unknown["seq"] == 3 and "revoked at seq 2" in unknown["message"]


# -- the database refuses to rewrite history ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE ledger_app_ledgerentry SET outcome = 'error' WHERE agent_id = %s",
        "UPDATE ledger_app_ledgerentry SET body = body WHERE agent_id = %s",
        "DELETE FROM ledger_app_ledgerentry WHERE agent_id = %s",
        "DELETE FROM ledger_app_agentkey WHERE agent_id = %s",
        "UPDATE ledger_app_agentkey SET public_key = 'AAAA' WHERE agent_id = %s",
        "UPDATE ledger_app_agentkey SET fingerprint = 'x' WHERE agent_id = %s",
    ],
)
def test_direct_sql_update_and_delete_of_ledger_rows_fail(cast, statement):
    with pytest.raises(IntegrityError) as refused:
        with transaction.atomic():
            sql(statement, [cast.builder.agent.id])
    assert "refused" in str(refused.value)
    assert LedgerEntry.objects.filter(agent=cast.builder.agent, action="identity_created").exists()
    assert connection.vendor in ("sqlite", "postgresql")


def test_the_orm_cannot_delete_or_edit_an_entry_either_and_key_status_still_changes(cast):
    entry = LedgerEntry.objects.get(agent=cast.builder.agent)
    with pytest.raises(IntegrityError), transaction.atomic():
        entry.delete()
    with pytest.raises(IntegrityError), transaction.atomic():
        LedgerEntry.objects.filter(id=entry.id).update(outcome="error")
    assert AgentKey.objects.filter(agent=cast.builder.agent).update(status="rotated") == 1


def test_a_second_entry_for_the_same_seq_or_link_is_refused_even_if_code_were_wrong(cast):
    entry = LedgerEntry.objects.get(agent=cast.builder.agent)
    fields = {f.name: getattr(entry, f.name) for f in LedgerEntry._meta.fields if f.name != "id"}
    with pytest.raises(IntegrityError), transaction.atomic():
        LedgerEntry.objects.create(**{**fields, "hash": "f" * 64})
    with pytest.raises(IntegrityError), transaction.atomic():
        LedgerEntry.objects.create(**{**fields, "seq": 2, "hash": "f" * 64})


@pytest.mark.django_db(transaction=True)
def test_flush_empties_the_ledger_and_puts_the_guards_back():
    agent, _ = agent_create(name="flushed")
    call_command("flush", "--no-input", verbosity=0)
    assert not LedgerEntry.objects.exists() and not Agent.objects.exists()
    agent, _ = agent_create(name="again")
    with pytest.raises(IntegrityError), transaction.atomic():
        sql("DELETE FROM ledger_app_ledgerentry WHERE agent_id = %s", [agent.id])
    with pytest.raises(IntegrityError), transaction.atomic():
        sql("UPDATE ledger_app_ledgerentry SET outcome = 'error' WHERE agent_id = %s", [agent.id])


# -- what the recorder writes -------------------------------------------------------------------------------------


def _finished(cast, *, status, decided_by, principal="", tool="note_write", error=None, rule="tier:ask"):
    call = ToolCall.objects.create(
        agent=cast.builder.agent,
        channel=cast.ops,
        tool=tool,
        input={"text": "hello", "token": "aleph_agent_" + "x" * 30},
        status=status,
        verdict="ask" if decided_by in ("operator", "grant", "timeout") else "deny",
        decided_by=decided_by,
        rule=rule,
        reason="why " * 200,
        approval="a1" if principal else "",
        principal=principal,
        success=status == CallStatus.SUCCEEDED if status in (CallStatus.SUCCEEDED, CallStatus.FAILED) else None,
        error=error,
        duration_ms=7 if status in (CallStatus.SUCCEEDED, CallStatus.FAILED) else None,
        created_at=timezone.now(),
        finished_at=timezone.now(),
    )
    return call


RECORDED = [
    # (status, decided_by, principal, mutating) -> [(action, outcome, principal)]
    (
        CallStatus.SUCCEEDED,
        "operator",
        "olive",
        True,
        [("approval_granted", "ok", "olive"), ("tool_call", "ok", "olive")],
    ),
    (
        CallStatus.FAILED,
        "operator",
        "olive",
        True,
        [("approval_granted", "ok", "olive"), ("tool_call", "error", "olive")],
    ),
    (CallStatus.SUCCEEDED, "grant", "olive", False, [("approval_granted", "ok", "olive")]),
    (CallStatus.DENIED, "operator", "olive", True, [("approval_denied", "denied", "olive")]),
    (CallStatus.DENIED, "entry", "", False, [("tool_denied", "denied", None)]),
    (CallStatus.DENIED, "tier", "", True, [("tool_denied", "denied", None)]),
    (CallStatus.DENIED, "floor", "", True, [("tool_denied", "denied", None)]),
    (CallStatus.DENIED, "unattended", "", True, [("tool_denied", "denied", None)]),
    (CallStatus.EXPIRED, "timeout", "", True, [("tool_denied", "denied", None)]),
    (CallStatus.SUCCEEDED, "tier", "", True, [("tool_call", "ok", None)]),
    (CallStatus.FAILED, "entry", "", True, [("tool_call", "error", None)]),
    (CallStatus.SUCCEEDED, "tier", "", False, []),
    (CallStatus.PENDING_APPROVAL, "tier", "", True, []),
]


@pytest.mark.parametrize(("status", "decided_by", "principal", "mutating", "expected"), RECORDED)
def test_the_recorder_writes_the_right_entries(cast, status, decided_by, principal, mutating, expected):
    error = {"code": "boom", "message": "failed with aleph_user_" + "y" * 30} if status == CallStatus.FAILED else None
    call = _finished(cast, status=status, decided_by=decided_by, principal=principal, error=error)
    with transaction.atomic():
        LedgerRecorder().record(call, mutating=mutating)
    written = entries(cast.builder.agent)[1:]
    assert [(e["action"], e["outcome"], e["principal"]) for e in written] == expected
    assert LedgerRecorder().records(call, mutating=mutating) == bool(expected)
    args, _ = arguments_sha256(call.input)
    for entry in written:
        assert entry["tool"] == "note_write" and entry["call"] == str(call.id) and entry["args_sha256"] == args
        assert entry["detail"]["channel"] == "ops" and entry["detail"]["decided_by"] == decided_by
        assert "aleph_agent_x" not in json.dumps(entry) and "aleph_user_y" not in json.dumps(entry)
    if status == CallStatus.FAILED:
        assert written[-1]["detail"]["error"] == {"code": "boom", "message": "failed with [redacted]"}
    if written and "reason" in written[0]["detail"]:
        assert len(written[0]["detail"]["reason"]) < 600 and written[0]["detail"]["reason"].endswith("chars]")
    verified("builder")


DECIDERS = ("tier", "entry", "floor", "unattended", "timeout", "operator", "grant", "session")


@pytest.mark.parametrize("mutating", [True, False])
@pytest.mark.parametrize("decided_by", DECIDERS)
@pytest.mark.parametrize("status", CallStatus.values)
def test_the_recorder_says_beforehand_exactly_when_it_signs(status, decided_by, mutating):
    """The chokepoint skips the transaction when `records` says no: it must never say no to a call that signs."""
    call = ToolCall(tool="note_write", input={"text": "x"}, status=status, decided_by=decided_by)
    finished = status in (CallStatus.SUCCEEDED, CallStatus.FAILED, CallStatus.DENIED, CallStatus.EXPIRED)
    signed = finished and bool(call_events(call, mutating=mutating, channel="ops"))
    assert LedgerRecorder().records(call, mutating=mutating) == signed


def test_an_entry_lands_only_if_the_call_row_lands(cast):
    call = _finished(cast, status=CallStatus.DENIED, decided_by="entry")
    with pytest.raises(RuntimeError), transaction.atomic():
        LedgerRecorder().record(call, mutating=True)
        raise RuntimeError("the event-log write failed after the append")
    assert len(entries(cast.builder.agent)) == 1
    assert ChainHead.objects.get(agent=cast.builder.agent).seq == 1


def test_a_call_denied_by_a_permission_entry_through_the_api_is_signed_on_the_chain(cast):
    builder = cast.builder.agent
    ToolPermission.objects.create(scope="agent", agent=builder, pattern="note_write", action="deny", note="no notes")
    response = client_for(cast.builder.token).post(
        "/api/v1/calls/", {"tool": "note_write", "input": {"text": "remember"}, "channel": "ops"}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "denied" and response.json()["decision"]["decided_by"] == "entry"
    last = entries(builder)[-1]
    assert last["action"] == "tool_denied" and last["outcome"] == "denied" and last["tool"] == "note_write"
    assert last["call"] == response.json()["id"] and last["principal"] is None
    assert last["detail"]["rule"] == "agent:builder:note_write" and last["detail"]["decided_by"] == "entry"
    assert last["args_sha256"] == arguments_sha256({"text": "remember"})[0]
    verified("builder")


def test_a_read_that_ran_stays_out_of_the_ledger(cast):
    response = client_for(cast.builder.token).post(
        "/api/v1/calls/", {"tool": "note_search", "input": {"query": "x"}, "channel": "ops"}, format="json"
    )
    assert response.json()["status"] == "succeeded"
    assert [e["action"] for e in entries(cast.builder.agent)] == ["identity_created"]


def test_a_tampered_chain_head_cannot_make_the_recorder_fork_the_chain(cast):
    builder = cast.builder.agent
    ChainHead.objects.filter(agent=builder).update(seq=0, hash="0" * 64)
    with pytest.raises(IntegrityError), transaction.atomic():
        ledger_append(agent_id=builder.id, event=Event(action="tool_call", outcome="ok"))
    assert LedgerEntry.objects.filter(agent=builder).count() == 1


# -- the format's building blocks ---------------------------------------------------------------------------------


def test_detail_is_redacted_capped_and_always_encodable():
    detail = detail_redact(
        {
            "api_key": "sk-live-1234567890abcdefghijkl",
            "nested": {"password": "hunter2", "ratio": 0.5, "big": 2**60, "ok": 3, "list": [1.5, None, True]},
            "long": "x" * 2000,
            "mention": "use aleph_agent_" + "z" * 40 + " please",
        }
    )
    assert detail["api_key"] == "[redacted]" and detail["nested"]["password"] == "[redacted]"
    assert detail["nested"]["ratio"] == "0.5" and detail["nested"]["big"] == str(2**60) and detail["nested"]["ok"] == 3
    assert detail["nested"]["list"] == ["1.5", None, True]
    assert len(detail["long"]) < 600 and detail["mention"] == "use [redacted] please"
    canonical(detail)
    too_big = detail_redact({"blob": ["y" * 400] * 40})
    assert too_big["truncated"] is True and too_big["bytes"] > 4096 and set(too_big) == {"truncated", "bytes"}


def test_strict_parsing_marks_repeated_keys_and_inexact_numbers():
    assert type(strict_loads('{"a":1,"a":2}')).__name__ == "Duplicated"
    assert type(strict_loads('{"a":1.0}')["a"]).__name__ == "Inexact"
    assert type(strict_loads('{"a":9007199254740993}')["a"]).__name__ == "Inexact"
    assert strict_loads('{"a":9007199254740991}')["a"] == 2**53 - 1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=5))
def test_the_fast_encoding_is_exactly_rfc8785(detail):
    import rfc8785

    from ledger_app.entries import body_encode

    body = {
        "v": 1,
        "agent": "a",
        "seq": 1,
        "time": "t",
        "action": "tool_call",
        "tool": None,
        "outcome": "ok",
        "args_sha256": None,
        "detail": detail,
        "principal": None,
        "call": None,
        "signer": "0" * 64,
        "prev_hash": "0" * 64,
    }
    try:
        expected = rfc8785.dumps(body)
    except rfc8785.CanonicalizationError:
        return
    problem, encoded = body_encode(strict_loads(expected))
    assert problem is None and encoded == expected


def test_arguments_fingerprint_is_rfc8785_and_falls_back_when_it_cannot_be():
    import hashlib

    import rfc8785

    assert arguments_sha256({"b": 1, "a": "é"}) == (
        hashlib.sha256(rfc8785.dumps({"a": "é", "b": 1})).hexdigest(),
        "rfc8785",
    )
    assert arguments_sha256({"n": 2**60})[1] == "json-sorted"


def test_ledger_commands_refuse_unknown_agents_and_bad_heads(cast):
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="no ledger for an agent named 'ghost'"):
        call_command("ledger", "verify", "ghost")
    with pytest.raises(CommandError, match="SEQ:HASH"):
        call_command("ledger", "verify", "builder", "--expect-head", "3:xyz")
    with pytest.raises(CommandError, match="needs an AGENT"):
        call_command("ledger", "verify", "--expect-head", "1:" + "a" * 64)
