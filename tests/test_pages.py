"""The people's pages: sign-in and sign-out, the navigation by role, the dashboard; and how it looks in Chromium."""

import io
import os
import re
from pathlib import Path

import httpx
import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import NoReverseMatch, reverse

from tests.conftest import chromium, client_for
from tools_app.browser.runtime import CHROMIUM as BROWSER_EXECUTABLE
from tools_app.models import Scope, ToolPermission

CHROMIUM = BROWSER_EXECUTABLE
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


def signed_in(person) -> Client:
    client = Client()
    assert client.login(username=person.user.username, password=person.password)
    return client


def nav_labels(html: str) -> list[str]:
    nav = re.search(r'<nav class="nav"[^>]*>(.*?)</nav>', html, re.S)
    return re.findall(r"<a [^>]*>([^<]+)</a>", nav.group(1)) if nav else []


def resolves(url_name: str) -> bool:
    try:
        reverse(url_name)
    except NoReverseMatch:
        return False
    return True


def test_the_dashboard_requires_sign_in(cast):
    response = Client().get("/")
    assert response.status_code == 302
    assert response["Location"] == "/login/?next=/"


def test_login_signs_in_and_goes_where_it_was_asked(cast):
    client = Client()
    page = client.get("/login/?next=/")
    assert page.status_code == 200
    assert 'name="username"' in page.content.decode() and 'name="password"' in page.content.decode()
    response = client.post("/login/", {"username": "olive", "password": cast.operator.password, "next": "/"})
    assert (response.status_code, response["Location"]) == (302, "/")
    assert client.get("/").status_code == 200
    assert client.get("/login/")["Location"] == "/"


def test_a_wrong_password_says_so_and_signs_nobody_in(cast):
    client = Client()
    response = client.post("/login/", {"username": "olive", "password": "wrong"})
    assert response.status_code == 200
    assert "do not match" in response.content.decode()
    assert client.get("/").status_code == 302


def test_login_does_not_redirect_off_site(cast):
    response = Client().post(
        "/login/", {"username": "olive", "password": cast.operator.password, "next": "https://evil.example/"}
    )
    assert (response.status_code, response["Location"]) == (302, "/")


def test_logout_needs_a_post_with_csrf_and_then_signs_out(cast):
    client = Client(enforce_csrf_checks=True)
    assert client.login(username="olive", password=cast.operator.password)
    page = client.get("/logout/")
    assert page.status_code == 200
    assert client.get("/").status_code == 200, "a GET of /logout/ must not sign out"
    assert client.post("/logout/").status_code == 403, "a cross-site POST must not sign out"
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    response = client.post("/logout/", {"csrfmiddlewaretoken": token})
    assert (response.status_code, response["Location"]) == (302, "/login/")
    assert client.get("/").status_code == 302


def test_the_navigation_shows_links_by_role(cast):
    admin = nav_labels(signed_in(cast.admin).get("/").content.decode())
    operator = nav_labels(signed_in(cast.operator).get("/").content.decode())
    auditor = nav_labels(signed_in(cast.auditor).get("/").content.decode())
    outsider = nav_labels(signed_in(cast.outsider).get("/").content.decode())
    assert admin[0] == "Dashboard" and "Admin" in admin
    assert "Dashboard" in operator and "Admin" not in operator
    assert "Dashboard" in auditor and "Admin" not in auditor
    assert outsider == []
    if resolves("approvals:index"):
        assert "Approvals" in admin and "Approvals" in operator and "Approvals" not in auditor
    if resolves("ledger:index"):
        assert "Ledger" in admin and "Ledger" in auditor and "Ledger" not in operator
    html = signed_in(cast.admin).get("/").content.decode()
    assert 'href="/admin/"' in html
    assert 'aria-current="page"' in html and ">Dashboard</a>" in html


def test_the_dashboard_lists_recent_calls_with_their_decisions_and_health(cast, as_builder):
    ToolPermission.objects.create(scope=Scope.CHANNEL, channel=cast.lab, pattern="note_*", action="deny")
    body = {"tool": "note_search", "input": {"query": "x"}}
    assert as_builder.post("/api/v1/calls/", {**body, "channel": "ops"}, format="json").json()["status"] == "succeeded"
    assert as_builder.post("/api/v1/calls/", {**body, "channel": "lab"}, format="json").json()["status"] == "denied"
    write = {"tool": "note_write", "input": {"text": "x"}, "channel": "nightly"}
    assert client_for(cast.scout.token).post("/api/v1/calls/", write, format="json").json()["status"] == "denied"
    html = signed_in(cast.auditor).get("/").content.decode()
    rows = re.findall(r"<tr>(.*?)</tr>", html.split("<tbody>")[1], re.S)
    assert len(rows) == 3
    cells = [re.sub(r"<[^>]+>", " ", row).split() for row in rows]
    assert [c[-6:] for c in cells] == [
        ["scout", "nightly", "note_write", "Denied", "unattended", "tier:ask"],
        ["builder", "lab", "note_search", "Denied", "entry", "channel:lab:note_*"],
        ["builder", "ops", "note_search", "Succeeded", "tier", "tier:ask"],
    ]
    assert 'class="badge ok">ok</span>' in html
    assert "sqlite" in html or "postgresql" in html


def test_an_empty_dashboard_says_so(cast):
    assert "No calls yet." in signed_in(cast.operator).get("/").content.decode()


def test_unknown_pages_are_html_404s_and_api_404s_are_json(cast):
    page = signed_in(cast.operator).get("/no-such-page/")
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")
    assert "There is no page here." in page.content.decode()
    api = Client().get("/api/v1/no-such-thing/")
    assert api.status_code == 404 and api.json()["error"]["code"] == "not_found"


# -- in a real browser --------------------------------------------------------------------------------------------


@pytest.fixture
def live_dashboard(daphne_server):
    """The cast and a few calls, written before the browser starts (the ORM refuses inside Playwright's loop)."""
    from tests.conftest import make_cast

    cast = make_cast()
    ToolPermission.objects.create(scope=Scope.CHANNEL, channel=cast.lab, pattern="note_*", action="deny")
    headers = {"Authorization": f"Bearer {cast.builder.token}"}
    for channel in ("ops", "lab", "nightly"):
        for tool, args in (("note_search", {"query": "deploy"}), ("note_write", {"text": "a long note " * 20})):
            body = {"tool": tool, "input": args, "channel": channel, "wait": 0}
            response = httpx.post(f"{daphne_server.url}/api/v1/calls/", json=body, headers=headers, timeout=30)
            assert response.status_code in (200, 202), response.text
    return cast


@pytest.mark.browser
def test_the_dashboard_fits_a_laptop_and_a_phone(daphne_server, live_dashboard):
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing: Debian's chromium package is not installed")
    ARTIFACTS.mkdir(exist_ok=True)
    admin = live_dashboard.admin
    with chromium() as browser:
        for size, viewport in (
            ("laptop", {"width": 1280, "height": 800}),
            ("phone", {"width": 390, "height": 844}),
        ):
            context = browser.new_context(viewport=viewport, device_scale_factor=1)
            page = context.new_page()
            page.goto(f"{daphne_server.url}/")
            assert page.url == f"{daphne_server.url}/login/?next=/"
            page.fill("input[name=username]", admin.user.username)
            page.fill("input[name=password]", admin.password)
            page.click("button[type=submit]")
            page.wait_for_url(f"{daphne_server.url}/")
            assert page.locator("h1").inner_text() == "Dashboard"
            assert page.locator("tbody tr").count() == 6
            assert page.locator("nav.nav a", has_text="Admin").is_visible()
            assert page.locator("button", has_text="Sign out").is_visible()
            page.screenshot(path=str(ARTIFACTS / f"dashboard-{size}.png"), full_page=True)
            widths = page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
            assert widths[0] <= widths[1], f"{size}: the page scrolls sideways ({widths[0]} > {widths[1]} px)"
            outside = page.evaluate(
                """() => [...document.querySelectorAll('header *, h1, .tile, .card')]
                    .filter(e => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
                    .map(e => e.tagName + '.' + e.className)"""
            )
            assert outside == [], f"{size}: elements run past the right edge: {outside}"
            context.close()


def test_the_dashboard_shows_each_chains_status(cast, as_builder):
    ToolPermission.objects.create(scope=Scope.GLOBAL, pattern="note_write", action="deny")
    write = {"tool": "note_write", "input": {"text": "x"}, "channel": "ops"}
    assert as_builder.post("/api/v1/calls/", write, format="json").json()["status"] == "denied"
    html = signed_in(cast.auditor).get("/").content.decode()
    assert "Ledger chains" in html
    assert "builder: never verified" in html
    call_command("ledger", "verify", "builder", stdout=io.StringIO())
    assert "builder: verified" in signed_in(cast.auditor).get("/").content.decode()
