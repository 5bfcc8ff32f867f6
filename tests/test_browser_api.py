"""Through the API on a live daphne: snapshot runs at once under Auto, evaluate parks, operators open screenshots."""

import os
from pathlib import Path

import httpx
import pytest
from django.test import Client

from tests.conftest import client_for, make_cast
from tools_app.browser import BrowserRuntime
from tools_app.browser.testing import PageServer
from tools_app.models import NetworkAllow, ToolCall
from tools_app.net import Outbound

PAGES = Path(__file__).resolve().parent / "browser_pages"
CHROMIUM = "/usr/bin/chromium"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason="Debian's chromium is not installed"),
]


@pytest.fixture
def server():
    with PageServer(PAGES) as running:
        yield running


def test_without_a_chromium_the_wiring_leaves_the_tools_not_configured(settings, tmp_path):
    settings.ALEPH_BROWSER_EXECUTABLE = ""
    assert BrowserRuntime.from_settings(outbound=Outbound()) is None
    settings.ALEPH_BROWSER_EXECUTABLE = str(tmp_path / "no-such-chromium")
    assert BrowserRuntime.from_settings(outbound=Outbound()) is None
    settings.ALEPH_BROWSER_EXECUTABLE = CHROMIUM
    wired = BrowserRuntime.from_settings(outbound=Outbound())
    assert wired is not None and not wired.running and wired._thread is None


def test_explain_asks_for_evaluate_and_allows_snapshot_under_auto(cast):
    cast.builder.agent.exec_tier = "auto"
    cast.builder.agent.save()
    admin = client_for(cast.admin.token)
    verdicts = {}
    for tool, arguments in (("browser_evaluate", {"expression": "1"}), ("browser_snapshot", {})):
        body = {"agent": "builder", "channel": "ops", "tool": tool, "input": arguments}
        verdicts[tool] = admin.post("/api/v1/policy/explain/", body, format="json").json()["decision"]
    assert (verdicts["browser_evaluate"]["verdict"], verdicts["browser_evaluate"]["rule"]) == ("ask", "tier:auto")
    assert (verdicts["browser_snapshot"]["verdict"], verdicts["browser_snapshot"]["rule"]) == ("allow", "tier:auto")


def test_through_the_api_evaluate_parks_for_approval_and_snapshot_runs_at_once(daphne_server, server):
    cast = make_cast()
    cast.builder.agent.exec_tier = "auto"
    cast.builder.agent.save()
    NetworkAllow.objects.create(entry=f"127.0.0.1:{server.port}", note="the browser test pages")

    def call(tool, arguments, wait=10.0):
        return httpx.post(
            f"{daphne_server.url}/api/v1/calls/",
            headers={"Authorization": f"Bearer {cast.builder.token}"},
            json={"tool": tool, "input": arguments, "channel": "ops", "wait": wait},
            timeout=90,
        )

    opened = call("browser_open", {"url": server.url("/form.html")})
    assert opened.status_code == 200, opened.text
    assert opened.json()["status"] == "succeeded", opened.json()
    assert opened.json()["result"]["output"]["title"] == "Sign up"

    snapshot = call("browser_snapshot", {})
    assert snapshot.status_code == 200
    body = snapshot.json()
    assert (body["status"], body["decision"]["verdict"], body["decision"]["rule"]) == (
        "succeeded",
        "allow",
        "tier:auto",
    )
    assert 'textbox "Full name"' in body["result"]["output"]["snapshot"]

    evaluated = call("browser_evaluate", {"expression": "document.title"}, wait=0.5)
    assert evaluated.status_code == 202, evaluated.text
    parked = evaluated.json()
    assert parked["status"] == "pending_approval"
    assert (parked["decision"]["verdict"], parked["decision"]["rule"]) == ("ask", "tier:auto")
    assert parked["result"] is None
    row = ToolCall.objects.get(id=parked["id"])
    assert row.status == "pending_approval" and row.tool == "browser_evaluate"
    assert row.approval_request.rule == "tier:auto"

    shot = call("browser_screenshot", {})
    assert shot.json()["status"] == "succeeded", shot.json()
    reference = shot.json()["result"]["output"]["screenshot"]
    assert reference["url"] == f"/browser/artifacts/{shot.json()['id']}/"
    operator, other, admin = Client(), Client(), Client()
    operator.force_login(cast.operator.user)
    other.force_login(cast.other_operator.user)
    admin.force_login(cast.admin.user)
    opened = operator.get(reference["url"])
    assert opened.status_code == 200 and opened["Content-Type"] == "image/png"
    assert opened.content.startswith(b"\x89PNG") and len(opened.content) == reference["bytes"]
    assert admin.get(reference["url"]).status_code == 200
    assert other.get(reference["url"]).status_code == 404, "otto operates lab, not ops"
    assert Client().get(reference["url"]).status_code == 302
    assert operator.get(f"/browser/artifacts/{parked['id']}/").status_code == 404
