"""Isolation: agents and sessions never share cookies or tabs; a named profile keeps cookies across browser restarts."""

import asyncio
import os
from pathlib import Path

import pytest
from nacl.secret import SecretBox

from tools_app.browser import BrowserRuntime
from tools_app.browser.testing import PageServer, ToolDriver
from tools_app.net import AllowList, Outbound

PAGES = Path(__file__).resolve().parent / "browser_pages"
CHROMIUM = "/usr/bin/chromium"
BOX = SecretBox(b"k" * SecretBox.KEY_SIZE)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason="Debian's chromium is not installed"),
]


@pytest.fixture(scope="module")
def server():
    with PageServer(PAGES) as running:
        yield running


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def runtime(server, data_dir):
    allowed = AllowList.parse([f"127.0.0.1:{server.port}"])
    browser = BrowserRuntime(outbound=Outbound(allow_source=lambda: allowed), data_dir=data_dir, profile_box=BOX)
    yield browser
    browser.close()


async def page_text(driver) -> str:
    return (await driver.ok("browser_snapshot"))["snapshot"]


async def test_two_agents_do_not_see_each_others_cookies_or_tabs(runtime, server):
    builder = ToolDriver(runtime, agent_id=1, agent_name="builder")
    scout = ToolDriver(runtime, agent_id=2, agent_name="scout")
    await builder.ok("browser_open", url=server.url("/set-cookie?team=red"))
    await builder.ok("browser_open", url=server.url("/form.html"))
    await scout.ok("browser_open", url=server.url("/cookies"))
    assert "team" not in await page_text(scout)
    assert (await scout.ok("browser_cookies"))["cookies"] == []
    assert [c["value"] for c in (await builder.ok("browser_cookies"))["cookies"]] == ["red"]

    builder_tabs = (await builder.ok("browser_tabs"))["tabs"]
    scout_tabs = (await scout.ok("browser_tabs"))["tabs"]
    assert [(t["tab_id"], t["title"]) for t in builder_tabs] == [("t1", "Cookie set"), ("t2", "Sign up")]
    assert [(t["tab_id"], t["title"]) for t in scout_tabs] == [("t1", "Cookies")]
    missing = await scout("browser_snapshot", tab_id="t2")
    assert missing.error.code == "tab_not_found"

    await scout.ok("browser_cookies", action="set", name="team", value="blue", url=server.url("/"))
    await builder.ok("browser_navigate", tab_id="t2", url=server.url("/cookies"))
    assert "team = red" in await page_text(builder)
    await scout.ok("browser_navigate", url=server.url("/cookies"))
    assert "team = blue" in await page_text(scout)
    assert [s["session"] for s in (await scout.ok("browser_session", action="list"))["sessions"]] == [None]


async def test_two_sessions_of_one_agent_are_isolated_too(runtime, server):
    morning = ToolDriver(runtime, agent_id=1, agent_name="builder", session_key="morning")
    evening = ToolDriver(runtime, agent_id=1, agent_name="builder", session_key="evening")
    await morning.ok("browser_open", url=server.url("/set-cookie?shift=morning"))
    await evening.ok("browser_open", url=server.url("/cookies"))
    assert "shift" not in await page_text(evening)
    assert (await evening.ok("browser_cookies"))["cookies"] == []
    listed = (await morning.ok("browser_session", action="list"))["sessions"]
    assert {s["session"] for s in listed} >= {"morning", "evening"}
    await evening.ok("browser_session", action="close")
    await morning.ok("browser_session", action="close")


async def test_a_persistent_profile_keeps_a_cookie_across_browser_restarts(runtime, server, data_dir):
    builder = ToolDriver(runtime, agent_id=1, agent_name="builder", session_key="signed-in")
    used = await builder.ok("browser_profile", action="use", name="work")
    assert (used["created"], used["cookies"]) == (True, 0)
    await builder.ok("browser_open", url=server.url("/set-cookie?sso=ticket-42"))
    first_pid, launches = runtime.pid, runtime.launches

    await asyncio.to_thread(runtime.stop)
    assert not runtime.running
    await builder.ok("browser_open", url=server.url("/cookies"))
    assert runtime.launches == launches + 1 and runtime.pid != first_pid
    assert "sso = ticket-42" in await page_text(builder)

    stored = list((data_dir / "browser" / "profiles" / "1").iterdir())
    assert [p.name for p in stored] == ["work.profile"]
    assert b"ticket-42" not in stored[0].read_bytes()

    # Another session of the agent (as after a server restart, which forgets which session used what) starts
    # without the cookie and gets it back from the saved profile when it asks for it.
    later = ToolDriver(runtime, agent_id=1, agent_name="builder", session_key="next-day")
    assert (await later.ok("browser_cookies"))["cookies"] == []
    assert (await later.ok("browser_profile", action="use", name="work"))["cookies"] == 1
    await later.ok("browser_open", url=server.url("/cookies"))
    assert "sso = ticket-42" in await page_text(later)

    scout = ToolDriver(runtime, agent_id=2, agent_name="scout")
    assert (await scout.ok("browser_profile"))["profiles"] == []
    theirs = await scout.ok("browser_profile", action="use", name="work")
    assert (theirs["created"], theirs["cookies"]) == (True, 0)

    assert (await builder.ok("browser_profile", action="delete", name="work"))["deleted"] == "work"
    assert (await builder.ok("browser_profile"))["profiles"] == []
    assert (await builder("browser_profile", action="delete", name="work")).error.code == "profile_not_found"
