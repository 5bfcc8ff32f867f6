"""Every request a page makes passes the SSRF engine: metadata and private addresses are refused before any dial."""

import os
from pathlib import Path

import pytest

from tools_app.browser import BrowserRuntime
from tools_app.browser.testing import PageServer, ToolDriver
from tools_app.net import AllowList, Outbound
from tools_app.net.testing import LOOPBACK, RecordingConnector, ScriptedResolver

PAGES = Path(__file__).resolve().parent / "browser_pages"
CHROMIUM = "/usr/bin/chromium"
FORBIDDEN = ("169.254.169.254", "10.0.0.1")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason="Debian's chromium is not installed"),
]


@pytest.fixture(scope="module")
def server():
    with PageServer(PAGES) as running:
        yield running


@pytest.fixture(scope="module")
def connector():
    """Every address the engine dials is recorded; only loopback is really dialed, anything else gets a canned reply."""
    return RecordingConnector()


@pytest.fixture(scope="module")
def runtime(server, connector, tmp_path_factory):
    allowed = AllowList.parse([f"127.0.0.1:{server.port}"])
    resolver = ScriptedResolver({"intranet.example": ["10.0.0.1"], "public.example": ["93.184.215.14"]})
    outbound = Outbound(allow_source=lambda: allowed, resolver=resolver, connector=connector)
    browser = BrowserRuntime(outbound=outbound, data_dir=tmp_path_factory.mktemp("data"))
    yield browser
    browser.close()


@pytest.fixture
async def drive(runtime, request):
    driver = ToolDriver(runtime, session_key=request.node.name)
    yield driver
    await driver("browser_session", action="close")


def assert_no_forbidden_dial(connector, runtime):
    dialed = {host for host, _ in connector.attempts}
    assert dialed <= LOOPBACK, dialed
    # What Chromium tried past the interception went to its refusing proxy on loopback, never to those hosts.
    assert runtime.sink.port is not None


async def test_metadata_and_private_sub_resources_are_blocked_before_any_connection(drive, server, connector, runtime):
    connector.attempts.clear()
    opened = await drive.ok("browser_open", url=server.url("/ssrf.html"))
    assert opened["title"] == "Greedy page"
    await drive.ok("browser_wait_for", text="fetch refused, ws closed")
    network = await drive.ok("browser_network")
    blocked = {(r["url"], r["type"]): r for r in network["requests"] if r["outcome"] == "blocked"}
    expected = {
        ("http://169.254.169.254/latest/meta-data/iam/security-credentials/", "image"): "metadata",
        ("http://10.0.0.1/pixel.png", "image"): "private",
        ("http://10.0.0.1/style.css", "stylesheet"): "private",
        ("http://10.0.0.1/x.js", "script"): "private",
        ("http://10.0.0.1/api", "fetch"): "private",
        ("http://169.254.169.254/beacon", "ping"): "metadata",
        ("http://169.254.169.254/", "document"): "metadata",
        ("ws://10.0.0.1/socket", "websocket"): "websocket",
    }
    for key, rule in expected.items():
        assert key in blocked, (key, sorted(blocked))
        assert blocked[key]["rule"] == rule, blocked[key]
    # An allowed URL that redirects to the metadata address: the hop is vetted and refused too.
    bounce = blocked[(server.url("/redirect?to=http://169.254.169.254/latest/meta-data/"), "image")]
    assert bounce["rule"] == "metadata"
    assert network["blocked_total"] == len(blocked) == 9
    assert "paragraph [ref=e7]: fetch refused, ws closed\n" in (await drive.ok("browser_snapshot"))["snapshot"] + "\n"
    assert_no_forbidden_dial(connector, runtime)
    assert set(connector.attempts) == {("127.0.0.1", server.port)}
    escaped = " ".join(runtime.sink.attempts)
    assert not any(host in escaped for host in FORBIDDEN), runtime.sink.attempts


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://10.0.0.1/", "private"),
        ("http://[::ffff:169.254.169.254]/", "ipv4_mapped"),
        ("http://0xa9fea9fe/", "metadata"),
        ("http://intranet.example/", "private"),
        ("file:///etc/passwd", "scheme"),
        ("javascript:alert(1)", "scheme"),
    ],
)
async def test_opening_a_forbidden_url_is_refused_and_leaves_no_tab(drive, connector, runtime, url, rule):
    connector.attempts.clear()
    refused = await drive("browser_open", url=url)
    assert refused.error.code == "ssrf_blocked", refused.error
    assert refused.error.detail["rule"] == rule
    assert (await drive.ok("browser_tabs"))["tabs"] == []
    assert_no_forbidden_dial(connector, runtime)


async def test_a_navigation_redirected_to_a_private_host_is_refused(drive, server, connector, runtime):
    connector.attempts.clear()
    direct = await drive("browser_open", url=server.url("/redirect?to=http://169.254.169.254/"))
    assert (direct.error.code, direct.error.detail["rule"]) == ("ssrf_blocked", "metadata")
    # A name that passes the static checks but resolves to a private address is refused when it is resolved.
    await drive.ok("browser_open", url=server.url("/form.html"))
    resolved = await drive("browser_navigate", url=server.url("/redirect?to=http://intranet.example/"))
    assert (resolved.error.code, resolved.error.detail["rule"]) == ("ssrf_blocked", "private")
    assert "10.0.0.1" in resolved.error.message
    assert_no_forbidden_dial(connector, runtime)


async def test_loopback_is_reachable_only_where_the_allow_list_says(drive, connector, runtime):
    with PageServer(PAGES) as other:
        refused = await drive("browser_open", url=other.url("/form.html"))
        assert (refused.error.code, refused.error.detail["rule"]) == ("ssrf_blocked", "loopback")
        assert other.hits == []


async def test_a_public_host_is_fetched_through_the_pinned_engine(drive, connector):
    """The browser never dials itself: the engine dials the vetted address (here a recorded, canned stand-in)."""
    connector.attempts.clear()
    opened = await drive.ok("browser_open", url="http://public.example/")
    assert opened["url"] == "http://public.example/"
    assert connector.attempts == [("93.184.215.14", 80)]
    assert b"Host: public.example" in connector.streams[-1].written
    assert "canned" in (await drive.ok("browser_snapshot"))["snapshot"]
