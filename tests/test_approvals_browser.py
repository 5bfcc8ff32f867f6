"""The operators' page in Debian's Chromium against a live daphne: a parked call, a click, the agent's result."""

import os
import re
from pathlib import Path

import httpx
import pytest

from tests.conftest import chromium
from tools_app.browser.runtime import CHROMIUM as BROWSER_EXECUTABLE

CHROMIUM = BROWSER_EXECUTABLE
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason="Debian's chromium is not installed"),
]


@pytest.fixture
def live_cast(daphne_server):
    from tests.conftest import make_cast

    return make_cast()


@pytest.fixture
def browser(live_cast):
    """Launched after the rows are written (see tests.conftest.chromium)."""
    with chromium() as launched:
        yield launched


def signed_in_page(browser, server, person):
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(f"{server.url}/login/?next=/approvals/")
    page.fill("input[name=username]", person.user.username)
    page.fill("input[name=password]", person.password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{server.url}/approvals/")
    expect(page.locator("#ap-connection")).to_have_text("live", timeout=10_000)
    return page


def park(server, agent, text, session=None):
    body = {"tool": "note_write", "input": {"text": text}, "channel": "ops", "wait": 0}
    if session:
        body["session"] = session
    response = httpx.post(
        f"{server.url}/api/v1/calls/", json=body, headers={"Authorization": f"Bearer {agent.token}"}, timeout=10
    )
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "pending_approval"
    return response.json()["id"]


def call_result(server, agent, call_id):
    response = httpx.get(
        f"{server.url}/api/v1/calls/{call_id}/?wait=10",
        headers={"Authorization": f"Bearer {agent.token}"},
        timeout=20,
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_an_operator_releases_a_parked_call_from_the_browser(daphne_server, live_cast, browser):
    from playwright.sync_api import expect

    cast = live_cast
    olive = signed_in_page(browser, daphne_server, cast.operator)
    admin = signed_in_page(browser, daphne_server, cast.admin)

    long_text = "Release notes for 2.4:\n" + "\n".join(f"- item {n}: " + "x" * 60 for n in range(12))
    first = park(daphne_server, cast.builder, "deploy the staging notes", session="s1")
    second = park(daphne_server, cast.builder, long_text)

    cards = olive.locator(".ap-card")
    expect(cards).to_have_count(2, timeout=10_000)
    first_card = olive.locator(".ap-card", has_text="deploy the staging notes")
    expect(first_card).to_contain_text("note_write")
    expect(first_card).to_contain_text("builder")
    expect(first_card).to_contain_text("tier:ask")
    expect(first_card).to_contain_text("session s1")
    expect(first_card.locator(".ap-countdown")).to_have_text(re.compile(r"^[12]:\d\d$"))
    long_card = olive.locator(".ap-card", has_text="Release notes")
    expect(long_card.locator("details.ap-fold")).to_have_count(1)
    expect(long_card.locator("pre.ap-full")).not_to_be_visible()
    expect(admin.locator(".ap-card")).to_have_count(2, timeout=10_000)
    expect(olive).to_have_title("(2) Approvals · Aleph Gateway")

    ARTIFACTS.mkdir(exist_ok=True)
    olive.screenshot(path=str(ARTIFACTS / "approvals_two_cards.png"), full_page=True)

    first_card.locator("button[data-action=once]").click()
    result = call_result(daphne_server, cast.builder, first)
    assert result["status"] == "succeeded"
    assert result["result"]["success"] is True and result["result"]["output"]["stored_chars"] == 24
    assert result["decision"]["decided_by"] == "operator"
    assert result["decision"]["approval"]

    resolved = admin.locator(".ap-card", has_text="deploy the staging notes")
    expect(resolved.locator(".ap-outcome")).to_have_text("Approved by olive.", timeout=10_000)
    expect(resolved).to_have_count(0, timeout=15_000)

    # The admin denies the other card from the keyboard; it disappears from the operator's page with who decided.
    admin.locator(".ap-card", has_text="Release notes").click()
    admin.keyboard.press("d")
    admin.keyboard.type("too long, split it up")
    admin.keyboard.press("Enter")
    denied = call_result(daphne_server, cast.builder, second)
    assert denied["status"] == "denied"
    assert denied["decision"]["reason"] == "Denied by admin: too long, split it up"
    expect(long_card.locator(".ap-outcome")).to_have_text("Denied by admin: too long, split it up", timeout=10_000)
    expect(cards).to_have_count(0, timeout=15_000)
    expect(olive.locator("#ap-empty")).to_be_visible()
