"""The browser tools against pages served on 127.0.0.1: each does what it says, targeted by snapshot refs or points."""

import hashlib
import os
import re
from pathlib import Path

import pytest

from tools_app.browser import BrowserRuntime
from tools_app.browser.testing import PageServer, ToolDriver, ref_of
from tools_app.builtin.browser import BROWSER_TOOLS
from tools_app.chokepoint.base import DESTRUCTIVE, MUTATING, READ_ONLY, ToolContext, ToolInputError
from tools_app.net import AllowList, Outbound

PAGES = Path(__file__).resolve().parent / "browser_pages"
CHROMIUM = "/usr/bin/chromium"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason="Debian's chromium is not installed"),
]


@pytest.fixture(scope="module")
def server():
    with PageServer(PAGES) as running:
        yield running


@pytest.fixture(scope="module")
def runtime(server, tmp_path_factory):
    """One browser for the module; each test gets a session of its own, so no test sees another's tabs."""
    allowed = AllowList.parse([f"127.0.0.1:{server.port}"])
    browser = BrowserRuntime(outbound=Outbound(allow_source=lambda: allowed), data_dir=tmp_path_factory.mktemp("data"))
    yield browser
    browser.close()


@pytest.fixture
async def drive(runtime, request):
    driver = ToolDriver(runtime, session_key=request.node.name)
    yield driver
    await driver("browser_session", action="close")


async def snap(drive) -> str:
    return (await drive.ok("browser_snapshot"))["snapshot"]


def test_twenty_five_tools_with_honest_facts():
    tools = {cls.name: cls() for cls in BROWSER_TOOLS}
    assert len(tools) == 25
    read_only = {"browser_snapshot", "browser_screenshot", "browser_pdf", "browser_console", "browser_network"}
    read_only |= {"browser_wait_for"}
    for name, tool in tools.items():
        assert tool.requires == ("browser",), name
        expected = READ_ONLY if name in read_only else DESTRUCTIVE if name == "browser_evaluate" else MUTATING
        assert tool.facts == expected, name
        assert "selector" not in str(tool.input_schema()).lower(), name
    tabs, profile = tools["browser_tabs"], tools["browser_profile"]
    assert tabs.facts_for(tabs.parse({"action": "list"})) == READ_ONLY
    assert tabs.facts_for(tabs.parse({"action": "close", "tab_id": "t1"})) == MUTATING
    assert profile.facts_for(profile.parse({"action": "delete", "name": "work"})).requires_approval
    assert profile.facts_for(profile.parse({"action": "use", "name": "work"})) == MUTATING
    click = tools["browser_click"]
    for arguments, message in (
        ({}, "name the element: ref_id from browser_snapshot, or x and y"),
        ({"ref_id": "e1", "x": 1, "y": 2}, "give either ref_id or x and y, not both"),
        ({"x": 1}, "give both x and y, or neither"),
        ({"selector": "#big"}, "Extra inputs are not permitted"),
    ):
        with pytest.raises(ToolInputError) as refused:
            click.parse(arguments)
        assert message in refused.value.errors[-1]["msg"], arguments


MINIMAL_ARGUMENTS = {
    "browser_open": {"url": "http://127.0.0.1/"},
    "browser_navigate": {"url": "http://127.0.0.1/"},
    "browser_click": {"ref_id": "e1"},
    "browser_type": {"ref_id": "e1", "text": "x"},
    "browser_fill_form": {"fields": [{"ref_id": "e1", "value": "x"}]},
    "browser_select": {"ref_id": "e1", "values": ["x"]},
    "browser_press_key": {"key": "Enter"},
    "browser_hover": {"x": 1, "y": 1},
    "browser_drag": {"from_ref_id": "e1", "to_x": 5, "to_y": 5},
    "browser_upload": {"ref_id": "e1", "paths": ["a.txt"]},
    "browser_wait_for": {"time_s": 1},
    "browser_evaluate": {"expression": "1"},
    "browser_dialog": {"action": "accept"},
    "browser_emulate": {"offline": True},
    "browser_resize": {"width": 800, "height": 600},
}


async def test_without_the_runtime_every_tool_answers_not_configured():
    ctx = ToolContext(
        call_id="c", agent_id=1, agent_name="builder", channel_name="ops", session_key=None, attended=True
    )
    for cls in BROWSER_TOOLS:
        tool = cls(browser=None)
        result = await tool.run(tool.parse(MINIMAL_ARGUMENTS.get(cls.name, {})), ctx)
        assert (result.error.code, result.error.message) == ("not_configured", "browser not configured"), cls.name


async def test_a_form_is_filled_and_submitted_by_refs_from_a_snapshot(drive, server):
    opened = await drive.ok("browser_open", url=server.url("/form.html"))
    assert (opened["tab_id"], opened["title"]) == ("t1", "Sign up")
    page = await snap(drive)
    fields = [
        {"ref_id": ref_of(page, "textbox", "Full name"), "value": "Ada Lovelace"},
        {"ref_id": ref_of(page, "textbox", "Email"), "value": "ada@example.org"},
        {"ref_id": ref_of(page, "textbox", "About you"), "value": "Analyst"},
        {"ref_id": ref_of(page, "checkbox", "Send me the newsletter"), "value": True},
        {"ref_id": ref_of(page, "radio", "Pro"), "value": True},
        {"ref_id": ref_of(page, "combobox", "Country"), "value": "Japan"},
    ]
    filled = await drive.ok("browser_fill_form", fields=fields)
    assert filled["filled"] == [f["ref_id"] for f in fields]
    submitted = await drive.ok("browser_click", ref_id=ref_of(page, "button", "Create account"))
    assert submitted["url"] == server.url("/submit")
    assert submitted["title"] == "Submitted by POST"
    result = await snap(drive)
    for line in ("full_name = Ada Lovelace", "email = ada@example.org", "about = Analyst", "newsletter = yes"):
        assert line in result
    assert "plan = pro" in result and "country = jp" in result
    assert [hit.method for hit in server.hits if hit.path == "/submit"][-1] == "POST"


async def test_stale_and_unknown_refs_say_to_take_a_new_snapshot(drive, server):
    await drive.ok("browser_open", url=server.url("/form.html"))
    unknown = await drive("browser_click", ref_id="e999")
    assert unknown.error.code == "stale_ref"
    assert "browser_snapshot" in unknown.error.message
    button = ref_of(await snap(drive), "button", "Create account")
    await drive.ok("browser_navigate", url=server.url("/keys.html"))
    stale = await drive("browser_click", ref_id=button)
    assert stale.error.code == "stale_ref"
    assert stale.error.detail == {"ref_id": button, "tab_id": "t1"}


async def test_a_button_is_clicked_by_coordinates(drive, server):
    await drive.ok("browser_open", url=server.url("/widgets.html"))
    await drive.ok("browser_click", x=200, y=140)
    assert re.search(r'button "Clicked 1 time\(s\) at 200,140"', await snap(drive))
    await drive.ok("browser_click", x=150, y=110, double=True)
    assert 'button "Clicked 3 time(s) at 150,110"' in await snap(drive)
    outside = await drive("browser_click", x=5000, y=10)
    assert outside.error.code == "outside_viewport"


async def test_select_hover_drag_and_scroll(drive, server):
    await drive.ok("browser_open", url=server.url("/widgets.html"))
    page = await snap(drive)
    size = ref_of(page, "combobox", "Size")
    selected = await drive.ok("browser_select", ref_id=size, values=["Large"])
    assert selected["selected"] == ["l"]
    assert "chosen l" in await snap(drive)
    assert (await drive("browser_select", ref_id=size, values=["Huge"])).error.code == "no_such_option"
    not_select = await drive("browser_select", ref_id=ref_of(page, "button", "Menu"), values=["x"])
    assert not_select.error.code == "not_a_select"

    assert "Settings" not in page
    await drive.ok("browser_hover", ref_id=ref_of(page, "button", "Menu"))
    hovered = await snap(drive)
    assert 'menuitem "Settings"' in hovered and "hovered" in hovered

    await drive.ok("browser_drag", from_ref_id=ref_of(page, "img", "Card"), to_ref_id=ref_of(page, "region", "Bin"))
    assert "got card" in await snap(drive)
    await drive.ok("browser_navigate", action="reload")
    assert "empty" in await snap(drive)
    await drive.ok("browser_drag", from_x=140, from_y=340, to_x=480, to_y=360)
    assert "got card" in await snap(drive)

    bottom = ref_of(await snap(drive), "paragraph", "The bottom of the page")
    scrolled = await drive.ok("browser_scroll", ref_id=bottom)
    assert scrolled["scroll_y"] > 2000
    back_up = await drive.ok("browser_scroll", dy=-500)
    assert back_up["scroll_y"] == scrolled["scroll_y"] - 500


async def test_typing_and_key_presses(drive, server):
    await drive.ok("browser_open", url=server.url("/keys.html"))
    page = await snap(drive)
    search = ref_of(page, "searchbox", "Search")
    typed = await drive.ok("browser_type", ref_id=search, text="aleph", submit=True)
    assert typed["title"] == "Searched aleph"
    await drive.ok("browser_press_key", key="Control+k")
    assert "palette opened" in await snap(drive)
    await drive.ok("browser_type", ref_id=search, text="xy", slowly=True)
    await drive.ok("browser_press_key", key="Backspace", ref_id=search)
    after = await snap(drive)
    assert re.search(r"keys: .*Enter .*Control k .*x y Backspace", after), after
    assert (await drive("browser_press_key", key="NoSuchKey")).error.code == "browser_error"


async def test_alert_confirm_and_prompt_dialogs(drive, server):
    await drive.ok("browser_open", url=server.url("/dialogs.html"))
    page = await snap(drive)
    clicked = await drive.ok("browser_click", ref_id=ref_of(page, "button", "Alert"))
    assert clicked["dialog"] == {"type": "alert", "message": "Saved!"}
    assert (await drive.ok("browser_snapshot"))["snapshot"] is None
    blocked = await drive("browser_click", ref_id=ref_of(page, "button", "Confirm"))
    assert blocked.error.code == "dialog_open" and "browser_dialog" in blocked.error.message
    answered = await drive.ok("browser_dialog", action="accept")
    assert answered["answered"]["action"] == "accept" and "dialog" not in answered
    assert "alert closed" in await snap(drive)

    await drive.ok("browser_click", ref_id=ref_of(page, "button", "Confirm"))
    await drive.ok("browser_dialog", action="dismiss")
    assert "cancelled" in await snap(drive)

    prompted = await drive.ok("browser_click", ref_id=ref_of(page, "button", "Prompt"))
    assert prompted["dialog"] == {"type": "prompt", "message": "Your name?", "default_value": "nobody"}
    await drive.ok("browser_dialog", action="accept", prompt_text="Ada")
    assert "hello Ada" in await snap(drive)
    assert (await drive("browser_dialog", action="accept")).error.code == "no_dialog"
    console = await drive.ok("browser_console", types=["dialog"])
    assert [e["text"] for e in console["entries"]] == ["alert: Saved!", "confirm: Delete it?", "prompt: Your name?"]


async def test_tabs_and_popups(drive, server):
    await drive.ok("browser_open", url=server.url("/tabs.html"))
    page = await snap(drive)
    await drive.ok("browser_click", ref_id=ref_of(page, "link", "Open keys in a new tab"))
    await drive.ok("browser_click", ref_id=ref_of(page, "button", "Pop up dialogs"))
    listed = await drive.ok("browser_wait_for", time_s=0.3) and await drive.ok("browser_tabs")
    assert [t["tab_id"] for t in listed["tabs"]] == ["t1", "t2", "t3"]
    assert {t["url"] for t in listed["tabs"][1:]} == {server.url("/keys.html"), server.url("/dialogs.html")}
    selected = await drive.ok("browser_tabs", action="select", tab_id="t2")
    assert selected["current"] == "t2"
    assert (await drive.ok("browser_snapshot"))["tab_id"] == "t2"
    opened = await drive.ok("browser_tabs", action="new", url=server.url("/form.html"))
    assert opened["current"] == "t4"
    closed = await drive.ok("browser_tabs", action="close", tab_id="t3")
    assert [t["tab_id"] for t in closed["tabs"]] == ["t1", "t2", "t4"]
    assert (await drive("browser_snapshot", tab_id="t3")).error.code == "tab_not_found"
    assert (await drive.ok("browser_snapshot", tab_id="t1"))["title"] == "Tabs"


async def test_upload_from_the_workspace_only(drive, runtime, server):
    workspace = runtime.workspace(drive_who(drive))
    (workspace / "docs").mkdir(exist_ok=True)
    (workspace / "docs" / "report.txt").write_text("quarterly numbers")
    (workspace / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 32)
    (workspace / "escape").unlink(missing_ok=True)
    (workspace / "escape").symlink_to("/etc/hostname")
    for name in ("original.bin", "linked"):
        (workspace / name).unlink(missing_ok=True)
    (workspace / "original.bin").write_bytes(b"twice named")
    os.link(workspace / "original.bin", workspace / "linked")

    await drive.ok("browser_open", url=server.url("/upload.html"))
    page = await snap(drive)
    attachment = ref_of(page, "button", "Attachment")
    uploaded = await drive.ok("browser_upload", ref_id=attachment, paths=["docs/report.txt", "picture.png"])
    assert [u["bytes"] for u in uploaded["uploaded"]] == [17, 40]
    for bad in ("../x", "/etc/passwd", "escape", "linked"):
        refused = await drive("browser_upload", ref_id=attachment, paths=[bad])
        assert refused.error.code == "path_refused", bad
    assert (await drive("browser_upload", ref_id=attachment, paths=["nope.txt"])).error.code == "file_not_found"
    await drive.ok("browser_click", ref_id=ref_of(page, "button", "Send"))
    result = await snap(drive)
    assert "attachment = report.txt (17 bytes): quarterly numbers" in result
    assert "attachment = picture.png (40 bytes)" in result

    await drive.ok("browser_navigate", action="back")
    chooser = ref_of(await snap(drive), "button", "Choose a picture")
    await drive.ok("browser_upload", ref_id=chooser, paths=["picture.png"])
    assert "picked picture.png" in await snap(drive)


def drive_who(drive):
    from tools_app.browser import Who

    return Who(drive.context.agent_id, drive.context.agent_name, drive.context.session_key or "")


async def test_screenshots_and_pdfs_are_saved_to_the_workspace(drive, runtime, server):
    workspace = runtime.workspace(drive_who(drive))
    await drive.ok("browser_open", url=server.url("/widgets.html"))
    shot = (await drive.ok("browser_screenshot"))["screenshot"]
    data = (workspace / shot["path"]).read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) == shot["bytes"]
    assert hashlib.sha256(data).hexdigest() == shot["sha256"]
    assert shot["uri"] == f"workspace://builder/{shot['path']}" and shot["path"].startswith("browser/")
    assert shot["url"] == "/browser/artifacts/test/"
    full = (await drive.ok("browser_screenshot", full_page=True, format="jpeg", filename="full.jpeg"))["screenshot"]
    assert full["path"] == "browser/full.jpeg" and full["media_type"] == "image/jpeg"
    assert (workspace / "browser/full.jpeg").read_bytes()[:2] == b"\xff\xd8"
    element = ref_of(await snap(drive), "button", "Press me")
    small = (await drive.ok("browser_screenshot", ref_id=element))["screenshot"]
    assert small["bytes"] < shot["bytes"]
    refused = await drive("browser_screenshot", filename="../../x.png")
    assert refused.error.code == "path_refused"
    pdf = (await drive.ok("browser_pdf", filename="widgets.pdf"))["pdf"]
    assert (workspace / "browser/widgets.pdf").read_bytes().startswith(b"%PDF-")
    assert pdf["media_type"] == "application/pdf"


async def test_console_and_network_logs_show_what_the_page_did(drive, server):
    await drive.ok("browser_open", url=server.url("/console.html"))
    await drive.ok("browser_wait_for", text="loaded 3")
    console = await drive.ok("browser_console")
    seen = [(e["type"], e["text"]) for e in console["entries"]]
    for expected in (
        ("log", "page says hello"),
        ("warning", "this is a warning"),
        ("error", "something failed"),
        ("log", "got 3 items"),
    ):
        assert expected in seen
    assert any(kind == "pageerror" and "boom from a timer" in text for kind, text in seen)
    later = await drive.ok("browser_console", since=console["last_seq"])
    assert later["entries"] == []
    network = await drive.ok("browser_network")
    requests = {(r["method"], r["url"]): r for r in network["requests"]}
    page = requests[("GET", server.url("/console.html"))]
    assert (page["type"], page["outcome"], page["status"]) == ("document", "ok", 200)
    data = requests[("GET", server.url("/api/data"))]
    assert (data["type"], data["outcome"], data["status"], data["bytes"]) == ("fetch", "ok", 200, 20)
    assert network["blocked_total"] == 0


async def test_redirects_land_on_the_final_url_with_their_cookies(drive, server):
    opened = await drive.ok("browser_open", url=server.url("/redirect?to=/form.html&cookie=flavour=oat"))
    assert opened["url"] == server.url("/form.html") and opened["title"] == "Sign up"
    network = (await drive.ok("browser_network"))["requests"]
    assert [r["outcome"] for r in network[:2]] == ["redirected", "ok"]
    assert network[0]["redirected_to"] == server.url("/form.html")
    name = ref_of(await snap(drive), "textbox", "Full name")
    await drive.ok("browser_type", ref_id=name, text="after a redirect", submit=True)
    assert "full_name = after a redirect" in await snap(drive)
    await drive.ok("browser_navigate", url=server.url("/cookies"))
    assert "flavour = oat" in await snap(drive)
    back = await drive.ok("browser_navigate", action="back")
    assert back["url"] == server.url("/submit")
    forward = await drive.ok("browser_navigate", action="forward")
    assert forward["url"] == server.url("/cookies")


async def test_a_posted_form_redirected_like_a_sign_in_lands_signed_in(drive, server):
    await drive.ok("browser_open", url=server.url("/login.html"))
    page = await snap(drive)
    await drive.ok("browser_type", ref_id=ref_of(page, "textbox", "User"), text="ada")
    signed_in = await drive.ok("browser_click", ref_id=ref_of(page, "button", "Sign in"))
    assert (signed_in["url"], signed_in["title"]) == (server.url("/cookies"), "Cookies")
    assert "session = s1" in await snap(drive)
    await drive.ok("browser_navigate", action="back")
    page = await snap(drive)
    await drive.ok("browser_type", ref_id=ref_of(page, "textbox", "Note"), text="kept")
    kept = await drive.ok("browser_click", ref_id=ref_of(page, "button", "Keep the body"))
    assert kept["title"] == "Submitted by POST"
    assert "note = kept" in await snap(drive)


async def test_wait_for_text_and_its_timeout(drive, server):
    await drive.ok("browser_open", url=server.url("/console.html"))
    await drive.ok("browser_wait_for", text="loaded 3", timeout_s=5)
    missing = await drive("browser_wait_for", text="never shown", timeout_s=0.3)
    assert missing.error.code == "timeout" and "never shown" in missing.error.message


async def test_evaluate_cookies_emulate_and_resize(drive, server):
    await drive.ok("browser_open", url=server.url("/set-cookie?colour=blue"))
    evaluated = await drive.ok("browser_evaluate", expression="() => [document.title, 6 * 7]")
    assert evaluated["result"] == ["Cookie set", 42]
    element = ref_of(await snap(drive), "heading", "Cookie set")
    assert (await drive.ok("browser_evaluate", expression="e => e.tagName", ref_id=element))["result"] == "H1"

    listed = await drive.ok("browser_cookies")
    assert [(c["name"], c["value"]) for c in listed["cookies"]] == [("colour", "blue")]
    await drive.ok("browser_cookies", action="set", name="size", value="xl", url=server.url("/"))
    await drive.ok("browser_navigate", url=server.url("/cookies"))
    assert "colour = blue" in await snap(drive) and "size = xl" in await snap(drive)
    cleared = await drive.ok("browser_cookies", action="clear", name="colour")
    assert cleared["cleared"] == 1
    assert [c["name"] for c in (await drive.ok("browser_cookies"))["cookies"]] == ["size"]

    await drive.ok("browser_emulate", color_scheme="dark", timezone_id="Asia/Tokyo", locale="de-DE")
    probe = (
        "() => [matchMedia('(prefers-color-scheme: dark)').matches, Intl.DateTimeFormat().resolvedOptions().timeZone]"
    )
    assert (await drive.ok("browser_evaluate", expression=probe))["result"] == [True, "Asia/Tokyo"]
    await drive.ok("browser_tabs", action="new", url=server.url("/form.html"))
    assert (await drive.ok("browser_evaluate", expression=probe))["result"] == [True, "Asia/Tokyo"]
    resized = await drive.ok("browser_resize", width=800, height=600)
    assert resized["viewport"] == {"width": 800, "height": 600}
    assert (await drive.ok("browser_evaluate", expression="() => innerWidth"))["result"] == 800


async def test_session_info_and_close(drive, server):
    await drive.ok("browser_open", url=server.url("/set-cookie?a=1"))
    info = await drive.ok("browser_session")
    assert info["cookies"] == 1 and [t["tab_id"] for t in info["tabs"]] == ["t1"]
    closed = await drive.ok("browser_session", action="close")
    assert closed["closed"] is True
    fresh = await drive.ok("browser_session")
    assert fresh["cookies"] == 0 and fresh["tabs"] == []
    assert (await drive("browser_snapshot")).error.code == "no_tab"
