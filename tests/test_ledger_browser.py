"""The auditors' pages in Debian's Chromium against a live daphne: badges, filters, stepwise verify, export."""

import os
import uuid
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import chromium
from tests.ledger_support import run_script, sql, tampering
from tools_app.browser.runtime import CHROMIUM as BROWSER_EXECUTABLE

CHROMIUM = BROWSER_EXECUTABLE
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
ENTRIES = 2600  # more than one verification step (2,000), so the progress bar moves

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason="Debian's chromium is not installed"),
]


@pytest.fixture
def live_chain(daphne_server, monkeypatch):
    """The cast, and builder's chain with ENTRIES entries spread over the last 24 hours (times are signed too)."""
    from django.utils import timezone

    from ledger_app import services
    from ledger_app.services import Event, ledger_append
    from tests.conftest import make_cast

    cast = make_cast()
    start = timezone.now() - timedelta(hours=23, minutes=30)
    moments = iter(start + timedelta(seconds=i * 23.5 * 3600 / ENTRIES) for i in range(ENTRIES))
    monkeypatch.setattr(services, "timezone", SimpleNamespace(now=lambda: next(moments)))
    shapes = [
        ("tool_call", "ok", "note_write", None),
        ("tool_call", "ok", "file_ops", None),
        ("tool_denied", "denied", "vault_store", None),
        ("approval_granted", "ok", "bash_exec", "olive"),
        ("tool_call", "error", "bash_exec", "olive"),
        ("tool_call", "ok", "note_write", None),
        ("tool_call", "ok", "web_fetch", None),
    ]
    for i in range(ENTRIES - 1):
        action, outcome, tool, principal = shapes[(i * 3 + i // 97) % len(shapes)]
        event = Event(action=action, outcome=outcome, tool=tool, principal=principal, call=str(uuid.uuid4()))
        ledger_append(agent_id=cast.builder.agent.id, event=event)
    monkeypatch.undo()
    return SimpleNamespace(cast=cast, server=daphne_server)


@pytest.fixture
def browser(live_chain):
    """Launched after the rows are written (see tests.conftest.chromium)."""
    with chromium() as launched:
        yield launched


def signed_in(browser, server, person, width=1280, height=900):
    context = browser.new_context(viewport={"width": width, "height": height}, accept_downloads=True)
    page = context.new_page()
    page.goto(f"{server.url}/login/?next=/ledger/")
    page.fill("input[name=username]", person.user.username)
    page.fill("input[name=password]", person.password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{server.url}/ledger/")
    return page


def test_an_auditor_browses_verifies_and_exports_a_chain(live_chain, browser, tmp_path):
    from playwright.sync_api import expect

    cast, server = live_chain.cast, live_chain.server
    ARTIFACTS.mkdir(exist_ok=True)
    page = signed_in(browser, server, cast.auditor)
    expect(page.locator("nav.nav a", has_text="Ledger")).to_have_attribute("aria-current", "page")
    builder_row = page.locator("tr", has_text="builder")
    expect(builder_row.locator(".badge")).to_have_text("never verified")
    expect(builder_row.locator("td.lg-num")).to_have_text(str(ENTRIES))
    assert page.locator("svg.lg-chart g rect[fill]").count() >= 20, "the chart should draw most of 24 hours"
    page.screenshot(path=ARTIFACTS / "ledger-index.png", full_page=True)

    page.click("text=builder")
    page.wait_for_url(f"{server.url}/ledger/builder/")
    expect(page.locator("table.lg-entries tbody tr")).to_have_count(50)
    page.click("#lg-verify")
    expect(page.locator("#lg-progress")).to_be_visible()
    expect(page.locator("#lg-result")).to_contain_text(f"Verified: {ENTRIES} entries", timeout=60_000)
    expect(page.locator("#lg-badge")).to_have_text("verified")
    expect(page.locator("#lg-progress-text")).to_have_text(f"{ENTRIES:,} of {ENTRIES:,} entries checked")
    page.screenshot(path=ARTIFACTS / "ledger-chain-verified.png", full_page=True)

    page.select_option("select[name=outcome]", "denied")
    page.click("text=Filter")
    page.wait_for_url("**outcome=denied**")
    outcomes = page.locator("table.lg-entries tbody td:nth-child(5)").all_inner_texts()
    assert outcomes and set(outcomes) == {"denied"}
    page.click("text=Older →")
    page.wait_for_url("**before=**")
    assert set(page.locator("table.lg-entries tbody td:nth-child(5)").all_inner_texts()) == {"denied"}

    with page.expect_download() as download:
        page.click("text=Download export")
    exported = tmp_path / "builder.json"
    download.value.save_as(exported)
    report, code = run_script(exported)
    assert code == 0 and report["entries"] == ENTRIES

    page.locator("table.lg-entries tbody a").first.click()
    page.wait_for_url("**/ledger/builder/*/")
    expect(page.locator("pre.lg-bytes")).to_contain_text("aleph-ledger/v1")
    expect(page.locator("text=matches the bytes below")).to_be_visible()
    expect(page.locator("text=valid under the signer's key")).to_be_visible()
    page.screenshot(path=ARTIFACTS / "ledger-entry.png", full_page=True)

    phone = signed_in(browser, server, cast.auditor, width=390, height=844)
    phone.goto(f"{server.url}/ledger/builder/")
    expect(phone.locator("#lg-progress")).to_be_hidden()
    assert phone.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), "no sideways scrolling"
    phone.screenshot(path=ARTIFACTS / "ledger-chain-phone.png", full_page=True)


@pytest.fixture
def tampered(live_chain):
    """Entry 2222 edited behind the application's back (before the browser starts: its event loop bars the ORM)."""
    with tampering():
        sql(
            'UPDATE ledger_app_ledgerentry SET body = replace(body, \'"tool":"\', \'"tool":"x\') '
            "WHERE agent_id = %s AND seq = 2222",
            [live_chain.cast.builder.agent.id],
        )
    return live_chain


def test_a_tampered_chain_turns_the_badge_red(tampered, browser):
    from playwright.sync_api import expect

    cast, server = tampered.cast, tampered.server
    page = signed_in(browser, server, cast.auditor)
    page.goto(f"{server.url}/ledger/builder/")
    page.click("#lg-verify")
    expect(page.locator("#lg-badge")).to_have_text("broken at seq 2222", timeout=60_000)
    expect(page.locator(".lg-breaks")).to_contain_text("edited at seq 2222")
    expect(page.locator("#lg-result")).to_contain_text("Broken: 1 kind of break found")
    page.screenshot(path=ARTIFACTS / "ledger-chain-broken.png", full_page=True)
    page.goto(f"{server.url}/ledger/")
    expect(page.locator("tr", has_text="builder").locator(".badge")).to_have_text("broken at seq 2222")
