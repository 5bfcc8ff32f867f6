"""The auditors' API and pages: who may read, filters and keyset pages, verification with progress, export."""

import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from ledger_app import views
from ledger_app.models import ChainHead, ChainVerification, LedgerEntry
from ledger_app.services import Event, ledger_append
from tests.conftest import client_for
from tests.ledger_support import run_script, sql, tampering

API = "/api/v1/ledger"

SAMPLES = [
    ("tool_call", "ok", "note_write", None),
    ("tool_denied", "denied", "vault_store", None),
    ("approval_granted", "ok", "note_write", "olive"),
    ("tool_call", "error", "note_write", "olive"),
    ("approval_denied", "denied", "vault_store", "otto"),
    ("tool_call", "ok", "file_ops", None),
]


@pytest.fixture
def chain(cast):
    """builder: the identity entry and twelve more (two rounds of SAMPLES): seq 2-13."""
    for _ in range(2):
        for action, outcome, tool, principal in SAMPLES:
            event = Event(action=action, outcome=outcome, tool=tool, principal=principal, call=str(uuid.uuid4()))
            ledger_append(agent_id=cast.builder.agent.id, event=event)
    return cast


def browser_for(user) -> Client:
    browser = Client()
    browser.force_login(user)
    return browser


@pytest.mark.parametrize("path", ["entries/", "verify/", "export/"])
def test_only_auditors_and_admins_may_read_the_ledger_api(chain, path):
    url = f"{API}/builder/{path}"
    assert client_for(chain.auditor.token).get(url).status_code == 200
    assert client_for(chain.admin.token).get(url).status_code == 200
    for token in (chain.operator.token, chain.outsider.token, chain.builder.token):
        response = client_for(token).get(url)
        assert response.status_code == 403 and response.json()["error"]["code"] == "permission_denied"
    anonymous = Client().get(url)
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "not_authenticated"
    missing = client_for(chain.auditor.token).get(f"{API}/nobody/{path}")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "agent_not_found"


def test_entries_are_the_signed_documents_newest_first(chain):
    body = client_for(chain.auditor.token).get(f"{API}/builder/entries/").json()
    assert body["agent"] == "builder" and body["next"] is None and body["previous"] is None
    assert [e["seq"] for e in body["results"]] == list(range(13, 0, -1))
    first = body["results"][-1]
    assert first["action"] == "identity_created" and set(first) >= {"hash", "signature", "prev_hash", "signer"}
    stored = LedgerEntry.objects.get(agent=chain.builder.agent, seq=1)
    assert {k: v for k, v in first.items() if k not in ("hash", "signature")} == json.loads(stored.body)


@pytest.mark.parametrize(
    ("query", "seqs"),
    [
        ({"action": "tool_call"}, [13, 11, 8, 7, 5, 2]),
        ({"outcome": "denied"}, [12, 9, 6, 3]),
        ({"tool": "vault_store"}, [12, 9, 6, 3]),
        ({"principal": "olive"}, [11, 10, 5, 4]),
        ({"principal": "olive", "outcome": "error"}, [11, 5]),
        ({"action": "approval_denied", "principal": "otto"}, [12, 6]),
        ({"outcome": "ok", "tool": "", "principal": ""}, [13, 10, 8, 7, 4, 2, 1]),
    ],
)
def test_filters(chain, query, seqs):
    body = client_for(chain.auditor.token).get(f"{API}/builder/entries/", query).json()
    assert [e["seq"] for e in body["results"]] == seqs


def test_time_filters(chain):
    entries = LedgerEntry.objects.filter(agent=chain.builder.agent).order_by("seq")
    middle = entries[6].time
    auditor = client_for(chain.auditor.token)
    after = auditor.get(f"{API}/builder/entries/", {"since": middle.isoformat()}).json()["results"]
    before = auditor.get(f"{API}/builder/entries/", {"until": middle.isoformat()}).json()["results"]
    assert [e["seq"] for e in after] == list(range(13, 6, -1))
    assert [e["seq"] for e in before] == list(range(6, 0, -1))


def test_keyset_pages_walk_the_chain_both_ways(chain):
    auditor = client_for(chain.auditor.token)
    seen, url, pages = [], f"{API}/builder/entries/?limit=4&outcome=ok", []
    while url:
        body = auditor.get(url).json()
        pages.append(body)
        seen += [e["seq"] for e in body["results"]]
        url = body["next"]
    assert seen == [13, 10, 8, 7, 4, 2, 1] and len(pages) == 2
    assert "outcome=ok" in pages[0]["next"] and pages[0]["previous"] is None
    back = auditor.get(pages[1]["previous"]).json()
    assert [e["seq"] for e in back["results"]] == [13, 10, 8, 7] and back["previous"] is None


@pytest.mark.parametrize(
    "query",
    [
        {"action": "tool_poke"},
        {"outcome": "fine"},
        {"limit": 0},
        {"limit": 501},
        {"before": 3, "after": 1},
        {"since": "yesterday"},
        {"before": -4},
        {"tool": "a\x00b"},
    ],
)
def test_bad_filters_are_400(chain, query):
    response = client_for(chain.auditor.token).get(f"{API}/builder/entries/", query)
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_request"


def test_verify_reports_records_and_takes_an_expected_head(chain):
    auditor = client_for(chain.auditor.token)
    report = auditor.get(f"{API}/builder/verify/").json()
    assert report["ok"] and report["entries"] == 13 and report["breaks"] == [] and report["keys"] == 1
    recorded = ChainVerification.objects.get(agent=chain.builder.agent)
    assert recorded.ok and recorded.source == "api" and recorded.checked_by == chain.auditor.user
    head = ChainHead.objects.get(agent=chain.builder.agent)
    ahead = auditor.get(f"{API}/builder/verify/", {"expect_head": f"20:{head.hash}"}).json()
    assert not ahead["ok"] and [(b["kind"], b["seq"]) for b in ahead["breaks"]] == [("truncated", 14)]
    bad = auditor.get(f"{API}/builder/verify/", {"expect_head": "20:nothex"})
    assert bad.status_code == 400


def test_the_exported_document_verifies_offline(chain, tmp_path):
    response = client_for(chain.auditor.token).get(f"{API}/builder/export/")
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == 'attachment; filename="builder-ledger.json"'
    path = tmp_path / "export.json"
    path.write_bytes(b"".join(response.streaming_content))
    document = json.loads(path.read_text())
    assert document["format"] == "aleph-ledger-export" and len(document["entries"]) == 13
    report, code = run_script(path)
    assert code == 0 and report["ok"] and report["entries"] == 13


# -- pages --------------------------------------------------------------------------------------------------------


def test_the_pages_are_for_auditors_and_admins(chain):
    for user in (chain.auditor.user, chain.admin.user):
        browser = browser_for(user)
        assert browser.get("/ledger/").status_code == 200
        assert browser.get("/ledger/builder/").status_code == 200
        assert browser.get("/ledger/builder/3/").status_code == 200
    for user in (chain.operator.user, chain.outsider.user):
        assert browser_for(user).get("/ledger/").status_code == 403
        assert browser_for(user).get("/ledger/builder/3/").status_code == 403
    assert Client().get("/ledger/").status_code == 302
    assert browser_for(chain.auditor.user).get("/ledger/nobody/").status_code == 404
    assert browser_for(chain.auditor.user).get("/ledger/builder/99/").status_code == 404


def test_the_nav_bar_links_the_ledger_for_auditors_only(chain):
    assert 'href="/ledger/"' in browser_for(chain.auditor.user).get("/").content.decode()
    assert 'href="/ledger/"' not in browser_for(chain.operator.user).get("/").content.decode()


def test_the_index_shows_each_chains_badge_and_activity(chain):
    browser = browser_for(chain.auditor.user)
    page = browser.get("/ledger/").content.decode()
    assert page.count("never verified") == 2 and "<svg" in page and "Export" in page
    client_for(chain.auditor.token).get(f"{API}/builder/verify/")
    page = browser.get("/ledger/").content.decode()
    assert "lg-verified" in page and page.count("never verified") == 1
    with tampering():
        sql(
            "UPDATE ledger_app_ledgerentry SET signature = %s WHERE agent_id = %s AND seq = 7",
            ["A" * 86 + "==", chain.builder.agent.id],
        )
    client_for(chain.auditor.token).get(f"{API}/builder/verify/")
    assert "broken at seq 7" in browser.get("/ledger/").content.decode()


def test_the_chain_page_filters_and_pages(chain):
    browser = browser_for(chain.auditor.user)
    page = browser.get("/ledger/builder/", {"outcome": "denied", "tool": "", "since": ""}).content.decode()
    assert page.count('class="badge lg-out-denied"') == 4 and "lg-out-ok" not in page
    page = browser.get("/ledger/builder/", {"limit": 5}).content.decode()
    assert "before=9" in page and ">13</a>" in page and ">8</a>" not in page
    page = browser.get("/ledger/builder/", {"action": "tool_poke"}).content.decode()
    assert "action:" in page  # the form error is shown, and the unfiltered chain below it


def test_the_entry_page_shows_the_hashed_bytes_and_its_place(chain):
    page = browser_for(chain.auditor.user).get("/ledger/builder/3/").content.decode()
    stored = LedgerEntry.objects.get(agent=chain.builder.agent, seq=3)
    assert "aleph-ledger/v1" in page and stored.hash in page and stored.signature in page
    assert "matches the bytes below" in page and "valid under the signer" in page and "links to #2" in page
    assert "#4 links here" in page and "Entry 3" in page


def _drive_verification(browser, agent="builder"):
    steps, cursor = [], ""
    while True:
        response = browser.post(f"/ledger/{agent}/verify/", {"cursor": cursor})
        assert response.status_code == 200, response.content
        answer = response.json()
        steps.append(answer)
        if answer["done"]:
            return steps
        cursor = answer["cursor"]


def test_the_verify_button_walks_a_long_chain_in_steps(chain, monkeypatch):
    monkeypatch.setattr(views, "VERIFY_STEP", 4)
    steps = _drive_verification(browser_for(chain.auditor.user))
    assert [s["checked"] for s in steps] == [4, 8, 12, 13] and all(s["total"] == 13 for s in steps)
    assert steps[-1]["report"]["ok"] and steps[-1]["report"]["entries"] == 13
    assert ChainVerification.objects.get(agent=chain.builder.agent).source == "page"


def test_the_verify_steps_find_a_break_and_refuse_forged_cursors(chain, monkeypatch):
    monkeypatch.setattr(views, "VERIFY_STEP", 5)
    with tampering():
        sql("DELETE FROM ledger_app_ledgerentry WHERE agent_id = %s AND seq = 9", [chain.builder.agent.id])
    browser = browser_for(chain.auditor.user)
    report = _drive_verification(browser)[-1]["report"]
    assert {(b["kind"], b["seq"]) for b in report["breaks"]} == {("sequence_gap", 10), ("broken_link", 10)}
    first = browser.post("/ledger/builder/verify/", {"cursor": ""}).json()
    forged = first["cursor"][:-3] + ("AAA" if not first["cursor"].endswith("AAA") else "BBB")
    assert browser.post("/ledger/builder/verify/", {"cursor": forged}).status_code == 400
    assert browser.post("/ledger/scout/verify/", {"cursor": first["cursor"]}).status_code == 400
    csrf = Client(enforce_csrf_checks=True)
    csrf.force_login(chain.auditor.user)
    assert csrf.post("/ledger/builder/verify/", {"cursor": ""}).status_code == 403


def test_the_page_export_downloads(chain):
    response = browser_for(chain.auditor.user).get("/ledger/builder/export/")
    assert response["Content-Disposition"] == 'attachment; filename="builder-ledger.json"'
    assert len(json.loads(b"".join(response.streaming_content))["entries"]) == 13


# -- 100,000 entries ----------------------------------------------------------------------------------------------

BIG = 100_000


@pytest.fixture
def big_chain(cast):
    """100,000 entries over 30 days (realistic index columns; the signatures do not matter for browsing)."""
    agent = cast.builder.agent
    start = datetime(2026, 1, 1, tzinfo=UTC)
    rows = []
    for seq in range(2, BIG + 2):
        action, outcome, tool, principal = SAMPLES[seq % len(SAMPLES)]
        moment = start + timedelta(seconds=seq * 26)
        rows.append(
            (
                agent.id,
                seq,
                f"{seq - 1:064x}",
                f"{seq:064x}",
                "A" * 88,
                "{}",
                connection.ops.adapt_datetimefield_value(moment),
                action,
                f"{tool}{seq % 40}" if action == "tool_call" else tool,
                outcome,
                principal,
                "b" * 64,
            )
        )
    with connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO ledger_app_ledgerentry (agent_id, seq, prev_hash, hash, signature, body, time, action, tool, "
            "outcome, principal, signer) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            rows,
        )
    ChainHead.objects.filter(agent=agent).update(seq=BIG + 1, hash=f"{BIG + 1:064x}", last_time=timezone.now())
    if connection.vendor == "postgresql":
        sql("ANALYZE ledger_app_ledgerentry")
    return cast


def test_browsing_stays_fast_at_100000_entries(big_chain):
    browser = browser_for(big_chain.auditor.user)
    auditor = client_for(big_chain.auditor.token)
    cases = [
        ("/ledger/builder/", {}),
        ("/ledger/builder/", {"before": 50_000}),
        ("/ledger/builder/", {"before": 60}),
        ("/ledger/builder/", {"outcome": "denied", "before": 70_000}),
        ("/ledger/builder/", {"tool": "note_write7", "before": 90_000}),
        ("/ledger/builder/", {"principal": "otto", "outcome": "denied"}),
        ("/ledger/builder/", {"since": "2026-01-10T00:00", "until": "2026-01-11T00:00"}),
        ("/ledger/builder/", {"action": "tool_call", "since": "2026-01-20T00:00", "before": 80_000}),
        ("/ledger/builder/", {"after": 99_000}),
        (f"{API}/builder/entries/", {"outcome": "error", "before": 40_000, "limit": 100}),
        (f"{API}/builder/entries/", {"since": "2026-01-29T00:00:00Z", "limit": 500}),
        ("/ledger/builder/55555/", {}),
        ("/ledger/", {}),
    ]
    timings = []
    for path, query in cases:
        client = auditor if path.startswith(API) else browser
        began = time.perf_counter()
        response = client.get(path, query)
        timings.append((time.perf_counter() - began, path, query))
        assert response.status_code == 200, (path, query, response.content[:500])
    print("\n".join(f"{seconds * 1000:7.1f} ms  {path} {query}" for seconds, path, query in timings))
    slowest = max(timings)
    assert slowest[0] < 1.0, slowest
    page = browser.get("/ledger/builder/", {"outcome": "denied", "before": 70_000}).content.decode()
    assert page.count('class="badge lg-out-denied"') == 50 and "before=" in page and "after=" in page
