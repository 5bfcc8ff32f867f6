"""web_fetch: readable output per content type, the size cap, timeouts, and refusals recorded like any other call."""

import gzip
import json
import time
import tomllib

import pytest
from django.urls import reverse

from tests.conftest import client_for
from tools_app.builtin.web import WebFetch, html_to_markdown
from tools_app.chokepoint.base import READ_ONLY, ToolContext
from tools_app.gateway import gateway
from tools_app.models import NetworkAllow, ToolCall
from tools_app.net import AllowList, Outbound
from tools_app.net.store import network_allow_current
from tools_app.net.testing import RecordingConnector, StubServer, respond
from tools_app.policy_store import policy_version
from tools_app.policy_toml import PolicyFileError, policy_export, policy_import

CTX = ToolContext(call_id="c", agent_id=1, agent_name="builder", channel_name="ops", session_key=None, attended=True)

PAGE = b"""<!doctype html><html><head><title> The  Page </title><style>p{color:red}</style>
<script>var secret = "never shown";</script></head>
<body><nav><a href="/home">Home</a></nav><h1>Main heading</h1><p>First <b>bold</b> paragraph,
with   spaces.</p><ul><li>one</li><li>two <a href="https://example.org/x?y=1">external</a></li></ul>
<pre>  keep
   this</pre><a href="javascript:alert(1)">js</a><a href="mailto:a@b.c">mail</a></body></html>"""


def trickle(handler):
    """Headers at once, then one byte every 50 ms for as long as anyone listens."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/plain")
    handler.end_headers()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not handler.server.stub.stop.is_set():
        handler.wfile.write(b"x")
        time.sleep(0.05)


def slow(handler):
    time.sleep(2)
    respond(handler, 200, b"late")


def endless(handler):
    """A chunked body of zeros that never ends on its own: the reader has to stop."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/octet-stream")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    chunk = b"\0" * 65536
    sent = 0
    while sent < 200_000_000 and not handler.server.stub.stop.is_set():
        handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        sent += len(chunk)
        handler.server.stub.sent = sent


BOMB = gzip.compress(b"\0" * 50_000_000, compresslevel=9)

ROUTES = {
    "/page": lambda h: respond(h, 200, PAGE, content_type="text/html; charset=utf-8", set_cookie="session=s3cret"),
    "/data": lambda h: respond(h, 200, b'{"a": [1, 2], "b": null}', content_type="application/json"),
    "/nan": lambda h: respond(h, 200, b'{"a": NaN}', content_type="application/json"),
    "/text": lambda h: respond(h, 200, "caf\u00e9".encode("latin-1"), content_type="text/plain; charset=latin-1"),
    "/image": lambda h: respond(h, 200, b"\x89PNG\r\n\x1a\n" + b"\0" * 100, content_type="image/png"),
    "/untyped": lambda h: respond(h, 200, b"plain words"),
    "/gzip": lambda h: respond(h, 200, gzip.compress(b"squeezed"), content_type="text/plain", content_encoding="gzip"),
    "/bomb": lambda h: respond(h, 200, BOMB, content_type="text/plain", content_encoding="gzip"),
    "/brotli": lambda h: respond(h, 200, b"??", content_type="text/plain", content_encoding="br"),
    "/big": lambda h: respond(h, 200, b"a" * 5000, content_type="text/plain"),
    "/endless": endless,
    "/slow": slow,
    "/trickle": trickle,
    "/missing": lambda h: respond(h, 404, b"nope", content_type="text/plain"),
}


@pytest.fixture
def stub():
    with StubServer(ROUTES) as server:
        server.server.stub = server
        server.sent = 0
        yield server


@pytest.fixture
def outbound(stub):
    allow_list = AllowList.parse([f"127.0.0.1:{stub.port}"])
    return Outbound(allow_source=lambda: allow_list, connector=RecordingConnector())


async def fetch(outbound, url, **args):
    tool = WebFetch(outbound=outbound)
    return await tool.run(tool.parse({"url": url, **args}), CTX)


def test_web_fetch_is_read_only_and_needs_the_outbound_door():
    assert WebFetch.facts == READ_ONLY
    assert WebFetch.requires == ("outbound",)


async def test_without_the_door_it_is_not_configured():
    tool = WebFetch()
    result = await tool.run(tool.parse({"url": "http://example.com/"}), CTX)
    assert result.error.code == "not_configured"


async def test_html_becomes_markdown_with_title_and_links(stub, outbound):
    result = await fetch(outbound, stub.url("/page"))
    assert result.success, result.error
    out = result.output
    assert out["kind"] == "html" and out["status"] == 200 and out["content_type"] == "text/html"
    assert out["title"] == "The Page"
    assert "# Main heading" in out["text"]
    assert "First bold paragraph, with spaces." in out["text"]
    assert "- two [external](https://example.org/x?y=1)" in out["text"]
    assert f"[Home]({stub.url('/home')})" in out["text"]
    assert "```\n  keep\n   this\n```" in out["text"]
    assert "never shown" not in out["text"] and "color:red" not in out["text"]
    assert out["links"] == [
        {"text": "Home", "url": stub.url("/home")},
        {"text": "external", "url": "https://example.org/x?y=1"},
    ]
    assert out["headers"]["set-cookie"] == "(omitted)"
    assert out["final_url"] == out["url"] == stub.url("/page")


def test_html_converter_handles_broken_markup():
    converted = html_to_markdown("<p>unclosed <a href='/x'>link<div>block</p></span><h2>T", base_url="http://h/")
    assert converted["links"][0]["url"] == "http://h/x"
    assert converted["text"].endswith("## T")
    assert html_to_markdown("", base_url="http://h/") == {"title": "", "text": "", "links": []}


async def test_json_text_binary_and_untyped(stub, outbound):
    data = await fetch(outbound, stub.url("/data"))
    assert data.output["kind"] == "json" and data.output["json"] == {"a": [1, 2], "b": None}
    nan = await fetch(outbound, stub.url("/nan"))
    assert nan.output["kind"] == "text" and "does not parse" in nan.output["note"]
    text = await fetch(outbound, stub.url("/text"))
    assert text.output["kind"] == "text" and text.output["text"] == "caf\u00e9"
    image = await fetch(outbound, stub.url("/image"))
    assert image.output["kind"] == "binary" and len(image.output["sha256"]) == 64
    assert "text" not in image.output and "108 bytes" in image.output["note"]
    untyped = await fetch(outbound, stub.url("/untyped"))
    assert untyped.output["kind"] == "text" and untyped.output["text"] == "plain words"
    missing = await fetch(outbound, stub.url("/missing"))
    assert missing.success and missing.output["status"] == 404 and missing.output["text"] == "nope"
    json.dumps([data.output, text.output, image.output])


async def test_head_returns_status_and_headers_only(stub, outbound):
    result = await fetch(outbound, stub.url("/page"), method="HEAD")
    assert result.success, result.error
    assert result.output["status"] == 200 and result.output["bytes"] == 0
    assert "text" not in result.output and result.output["headers"]["content-type"].startswith("text/html")
    assert stub.seen[-1].method == "HEAD"


async def test_compressed_bodies_are_decoded_and_bombs_stop_at_the_cap(stub, outbound):
    small = await fetch(outbound, stub.url("/gzip"))
    assert small.output["text"] == "squeezed"
    started = time.monotonic()
    bomb = await fetch(outbound, stub.url("/bomb"), max_bytes=100_000)
    assert bomb.error.code == "too_large" and "100000-byte cap" in bomb.error.message
    assert time.monotonic() - started < 2
    brotli = await fetch(outbound, stub.url("/brotli"))
    assert brotli.error.code == "unsupported_encoding"


async def test_declared_size_over_the_cap_is_refused_before_reading(stub, outbound):
    result = await fetch(outbound, stub.url("/big"), max_bytes=1000)
    assert result.error.code == "too_large" and "declares 5000 bytes" in result.error.message
    exact = await fetch(outbound, stub.url("/big"), max_bytes=5000)
    assert exact.success and exact.output["bytes"] == 5000


async def test_an_endless_body_is_cut_at_the_cap_while_streaming(stub, outbound):
    started = time.monotonic()
    result = await fetch(outbound, stub.url("/endless"), max_bytes=300_000)
    assert result.error.code == "too_large"
    assert result.error.detail["max_bytes"] == 300_000
    assert time.monotonic() - started < 3
    time.sleep(0.2)
    assert stub.sent < 20_000_000  # the server was stopped by the closed connection, far from its 200 MB


async def test_a_slow_server_times_out_cleanly(stub, outbound):
    started = time.monotonic()
    result = await fetch(outbound, stub.url("/slow"), timeout_s=0.5)
    assert result.error.code == "timeout"
    assert "within 0.5 s" in result.error.message
    assert time.monotonic() - started < 1.5


async def test_a_trickling_server_is_cut_off_by_the_total_deadline(stub, outbound):
    """Bytes keep arriving, so no read ever times out: only the deadline for the whole fetch ends it."""
    started = time.monotonic()
    result = await fetch(outbound, stub.url("/trickle"), timeout_s=1, max_bytes=10_000_000)
    elapsed = time.monotonic() - started
    assert result.error.code == "timeout"
    assert 0.9 < elapsed < 2.0


async def test_the_allow_list_is_the_only_way_in(stub):
    result = await fetch(Outbound(connector=RecordingConnector()), stub.url("/page"))
    assert result.error.code == "ssrf_blocked" and result.error.detail["rule"] == "loopback"


# -- through the chokepoint, and the stored allow list --------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_blocked_fetch_through_the_api_is_a_failed_call_in_the_event_log(cast):
    response = client_for(cast.builder.token).post(
        "/api/v1/calls/",
        {"tool": "web_fetch", "input": {"url": "http://169.254.169.254/latest/meta-data/"}, "channel": "ops"},
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "failed"
    assert body["result"]["success"] is False
    error = body["result"]["error"]
    assert error["code"] == "ssrf_blocked"
    assert error["detail"]["rule"] == "metadata"
    assert "(rule metadata)" in error["message"]
    call = ToolCall.objects.get(id=body["id"])
    assert call.tool == "web_fetch" and call.status == "failed" and call.success is False
    assert call.error["code"] == "ssrf_blocked" and call.error["detail"]["rule"] == "metadata"
    assert call.agent_id == cast.builder.agent.id


@pytest.mark.django_db(transaction=True)
def test_the_wired_gateway_fetches_through_the_stored_allow_list(cast, stub):
    """The real wiring: web_fetch reaches the stub only after the admin's allow entry exists."""
    assert gateway().registry.get("web_fetch").dependencies["outbound"] is not None
    as_builder = client_for(cast.builder.token)
    call = {"tool": "web_fetch", "input": {"url": stub.url("/data")}, "channel": "ops"}
    refused = as_builder.post("/api/v1/calls/", call, format="json").json()
    assert refused["result"]["error"]["code"] == "ssrf_blocked"
    NetworkAllow.objects.create(entry=f"127.0.0.1:{stub.port}")
    fetched = as_builder.post("/api/v1/calls/", call, format="json").json()
    assert fetched["status"] == "succeeded", fetched
    assert fetched["result"]["output"]["json"] == {"a": [1, 2], "b": None}


@pytest.mark.django_db
def test_the_stored_allow_list_follows_the_policy_version():
    assert network_allow_current().entries == ()
    version = policy_version()
    policy_import(text='[network]\nallow = ["mcp.internal:8443", { entry = "10.1.0.0/16", note = "lab" }]\n')
    assert policy_version() != version
    assert {e.text for e in network_allow_current().entries} == {"mcp.internal:8443", "10.1.0.0/16"}
    exported = policy_export()
    assert tomllib.loads(exported)["network"] == {
        "allow": [{"entry": "10.1.0.0/16", "note": "lab"}, "mcp.internal:8443"]
    }
    policy_import(text=exported.replace(', "mcp.internal:8443"', ""))
    assert [e.text for e in network_allow_current().entries] == ["10.1.0.0/16"]
    assert NetworkAllow.objects.get().note == "lab"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[network]\nallow = ["10.0.0.1/8"]\n', "network.allow.0: '10.0.0.1/8' is not a network"),
        ('[network]\nallow = ["ok.example", "http://x/"]\n', "network.allow.1:"),
        ('[network]\nallow = "10.0.0.0/8"\n', "network.allow"),
        ("[network]\ndeny = []\n", "network.deny"),
    ],
)
def test_a_bad_network_section_changes_nothing(toml, message):
    NetworkAllow.objects.create(entry="keep.example")
    with pytest.raises(PolicyFileError) as caught:
        policy_import(text=toml)
    assert message in str(caught.value)
    assert list(NetworkAllow.objects.values_list("entry", flat=True)) == ["keep.example"]


@pytest.mark.django_db
def test_the_admin_console_edits_the_allow_list(cast, client):
    client.force_login(cast.admin.user)
    add = reverse("admin:tools_app_networkallow_add")
    bad = client.post(add, {"entry": "10.0.0.1/8", "note": ""})
    assert bad.status_code == 200 and "is not a network" in bad.content.decode()
    version = policy_version()
    good = client.post(add, {"entry": "mcp.internal", "note": "the team's MCP server"})
    assert good.status_code == 302
    row = NetworkAllow.objects.get()
    assert row.changed_by == cast.admin.user
    assert policy_version() != version
    assert [e.host for e in network_allow_current().entries] == ["mcp.internal"]
    version = policy_version()
    client.post(reverse("admin:tools_app_networkallow_delete", args=[row.pk]), {"post": "yes"})
    assert not NetworkAllow.objects.exists() and policy_version() != version
    assert network_allow_current().entries == ()
    client.force_login(cast.operator.user)
    assert client.get(add).status_code in (302, 403)
