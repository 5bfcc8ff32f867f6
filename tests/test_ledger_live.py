"""End to end on a live daphne: an entry's denial and an operator's approval and denial become signed entries."""

import httpx

from tests.conftest import make_cast
from tools_app.models import ToolPermission


def test_denials_and_operator_decisions_through_the_api_are_signed_with_the_operator_as_principal(daphne_server):
    cast = make_cast()
    ToolPermission.objects.create(scope="agent", agent=cast.builder.agent, pattern="vault_store", action="deny")
    url = daphne_server.url
    agent = {"Authorization": f"Bearer {cast.builder.token}"}
    olive = {"Authorization": f"Bearer {cast.operator.token}"}
    auditor = {"Authorization": f"Bearer {cast.auditor.token}"}

    def call(tool, arguments):
        body = {"tool": tool, "input": arguments, "channel": "ops", "wait": 0}
        return httpx.post(f"{url}/api/v1/calls/", json=body, headers=agent, timeout=15)

    denied = call("vault_store", {"name": "k", "value": "s3cret-value"})
    assert denied.status_code == 200 and denied.json()["status"] == "denied", denied.text

    def decide(call_id, decision, reason=""):
        cards = httpx.get(f"{url}/api/v1/approvals/", params={"status": "pending"}, headers=olive, timeout=15).json()
        card = next(c for c in cards if c["call"] == call_id)
        body = {"decision": decision, "scope": "once", "reason": reason}
        answer = httpx.post(f"{url}/api/v1/approvals/{card['id']}/decide/", json=body, headers=olive, timeout=15)
        assert answer.status_code == 200, answer.text
        finished = httpx.get(f"{url}/api/v1/calls/{call_id}/", params={"wait": 10}, headers=agent, timeout=20)
        return finished.json()

    parked = call("note_write", {"text": "approved by a person"})
    assert parked.status_code == 202, parked.text
    approved = decide(parked.json()["id"], "approve")
    assert approved["status"] == "succeeded" and approved["decision"]["decided_by"] == "operator"

    parked = call("note_write", {"text": "refused by a person"})
    refused = decide(parked.json()["id"], "deny", "not today")
    assert refused["status"] == "denied"

    entries = httpx.get(f"{url}/api/v1/ledger/builder/entries/", headers=auditor, timeout=15).json()["results"]
    seen = [(e["action"], e["outcome"], e["tool"], e["principal"], e["call"]) for e in entries]
    assert seen == [
        ("approval_denied", "denied", "note_write", "olive", refused["id"]),
        ("tool_call", "ok", "note_write", "olive", approved["id"]),
        ("approval_granted", "ok", "note_write", "olive", approved["id"]),
        ("tool_denied", "denied", "vault_store", None, denied.json()["id"]),
        ("identity_created", "ok", None, None, None),
    ]
    assert entries[3]["detail"]["rule"] == "agent:builder:vault_store" and entries[3]["detail"]["decided_by"] == "entry"
    assert entries[0]["detail"]["reason"].endswith("not today") and entries[0]["detail"]["decided_by"] == "operator"
    assert "s3cret-value" not in str(entries)
    report = httpx.get(f"{url}/api/v1/ledger/builder/verify/", headers=auditor, timeout=15).json()
    assert report["ok"] and report["entries"] == 5, report
