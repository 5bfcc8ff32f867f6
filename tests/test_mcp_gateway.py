"""Aleph as an MCP server on live daphne, with real clients: the SDK over HTTP and stdio, and the Inspector CLI."""

import asyncio
import json
import os
import subprocess

import httpx
import httpx2
import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.test import Client as DjangoClient
from mcp import Client, MCPError
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import make_cast
from tests.mcp_support import PY, ROOT, db_release, node_bin, raw_row
from tools_app.gateway import gateway
from tools_app.mcp.server import Principal, principal_var, server_build, tool_input_schema
from tools_app.models import McpServer, Scope, ToolCall, ToolPermission
from tools_app.policy_store import current_policy


@pytest.fixture
async def _release_db():
    yield
    await db_release()


@pytest.fixture
def live(daphne_server, _release_db):
    cast = make_cast()
    ToolPermission.objects.create(scope=Scope.CHANNEL, channel=cast.ops, pattern="note_write", action="deny")
    daphne_server.cast = cast
    return daphne_server


def http_client(live, token: str, **headers: str) -> Client:
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}", **headers}, timeout=httpx2.Timeout(30, read=300)
    )
    return Client(streamable_http_client(f"{live.url}/mcp/", http_client=http), cache=None, read_timeout_seconds=60)


async def rest_tools(live, token: str, channel: str = "ops") -> tuple[list[dict], list[dict]]:
    async with httpx.AsyncClient(base_url=live.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as rest:
        tools = await rest.get("/api/v1/tools/", params={"channel": channel})
        schema = await rest.get("/api/v1/tools/schema/", params={"channel": channel, "format": "mcp"})
    assert tools.status_code == 200 and schema.status_code == 200
    return tools.json(), schema.json()


def _annotations(tool) -> dict:
    return tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else {}


async def test_sdk_client_over_http_lists_what_get_tools_shows_and_calls_through_the_chokepoint(live):
    cast = live.cast
    rest, schema = await rest_tools(live, cast.builder.token)
    async with http_client(live, cast.builder.token, **{"X-Aleph-Channel": "ops"}) as client:
        listed = (await client.list_tools()).tools
        assert {t.name for t in listed} == {t["name"] for t in rest}
        assert "note_write" not in {t.name for t in listed}  # denied: absent, as from GET tools/
        by_name = {entry["name"]: entry for entry in schema}
        for tool in listed:
            assert _annotations(tool) == by_name[tool.name]["annotations"], tool.name  # facts as annotations
            assert tool.input_schema == by_name[tool.name]["inputSchema"]
        assert _annotations(next(t for t in listed if t.name == "note_search"))["readOnlyHint"] is True

        result = await client.call_tool("note_search", {"query": "anything"})
        assert not result.is_error
        assert result.structured_content["status"] == "succeeded"
        assert result.structured_content["decision"]["rule"] == "tier:ask"
        call_id = result.structured_content["id"]
        call = await ToolCall.objects.select_related("agent", "channel").aget(id=call_id)
        assert (call.agent.name, call.channel.name, call.tool, call.status) == (
            "builder",
            "ops",
            "note_search",
            "succeeded",
        )

        denied = await client.call_tool("note_write", {"text": "hello"})
        assert denied.is_error
        assert "channel:ops:note_write" in denied.content[0].text
        assert denied.structured_content["decision"]["verdict"] == "deny"

        unknown = await client.call_tool("no_such_tool", {})
        assert unknown.is_error and "tool_not_found" in unknown.content[0].text
        bad = await client.call_tool("note_search", {"query": 7})
        assert bad.is_error and "invalid_arguments" in bad.content[0].text


async def test_the_endpoint_needs_an_agent_token_and_a_channel(live):
    cast = live.cast
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with httpx.AsyncClient(base_url=live.url, timeout=30) as raw:
        headers = {"Accept": "application/json, text/event-stream", "X-Aleph-Channel": "ops"}
        anonymous = await raw.post("/mcp/", json=initialize, headers=headers)
        assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "not_authenticated"
        assert anonymous.headers["www-authenticate"].startswith("Bearer")
        forged = await raw.post("/mcp/", json=initialize, headers={**headers, "Authorization": "Bearer forged"})
        assert forged.status_code == 401
        person = await raw.post(
            "/mcp/", json=initialize, headers={**headers, "Authorization": f"Bearer {cast.operator.token}"}
        )
        assert person.status_code == 403
        no_channel = await raw.post(
            "/mcp/",
            json=initialize,
            headers={"Accept": headers["Accept"], "Authorization": f"Bearer {cast.builder.token}"},
        )
        assert no_channel.status_code == 400 and no_channel.json()["error"]["code"] == "channel_required"
    async with http_client(live, cast.builder.token, **{"X-Aleph-Channel": "nowhere"}) as client:
        with pytest.raises(MCPError, match="nowhere"):
            await client.list_tools()
    async with Client(
        streamable_http_client(
            f"{live.url}/mcp/?channel=lab",
            http_client=httpx2.AsyncClient(headers={"Authorization": f"Bearer {cast.scout.token}"}),
        ),
        cache=None,
    ) as by_query:
        assert "note_search" in {t.name for t in (await by_query.list_tools()).tools}


def test_header_checks_read_the_called_tools_schema_not_a_whole_listing(cast):
    # The SDK checks Mcp-Param-* headers on every HTTP tools/call; without this lookup it ran tools/list each time.
    assert server_build().get_tool_input_schema is tool_input_schema
    ToolPermission.objects.create(scope=Scope.CHANNEL, channel=cast.ops, pattern="note_write", action="deny")
    current_policy()
    bound = principal_var.set(Principal(agent_id=cast.builder.agent.id, agent_name="builder", channel="ops"))
    try:
        assert tool_input_schema("note_search") == gateway().registry.get("note_search").input_schema()
        assert tool_input_schema("note_write") is None  # denied here, so hidden here too
        assert tool_input_schema("no_such_tool") is None
    finally:
        principal_var.reset(bound)
    assert tool_input_schema("note_search") is None  # no caller bound: nothing to check against


def _serve_env(token: str) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.mcp_settings",
        "ALEPH_TEST_DATABASE": str(connection.settings_dict["NAME"]),
        "ALEPH_AGENT_TOKEN": token,
    }


async def test_sdk_client_over_stdio_through_mcp_serve(live):
    cast = live.cast
    rest, _ = await rest_tools(live, cast.builder.token)
    env = await sync_to_async(_serve_env)(cast.builder.token)
    params = StdioServerParameters(
        command=PY,
        args=["manage.py", "mcp_serve", "--channel", "ops", "--session", "stdio-test"],
        env=env,
        cwd=str(ROOT),
    )
    async with Client(params, cache=None, read_timeout_seconds=60) as client:
        listed = (await client.list_tools()).tools
        assert {t.name for t in listed} == {t["name"] for t in rest}
        result = await client.call_tool("note_search", {"query": "stdio"})
        assert not result.is_error and result.structured_content["status"] == "succeeded"
        denied = await client.call_tool("note_write", {"text": "x"})
        assert denied.is_error
    call = await ToolCall.objects.select_related("session").aget(id=result.structured_content["id"])
    assert call.session.key == "stdio-test"


def test_mcp_serve_refuses_a_missing_or_unknown_token():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    env.pop("ALEPH_AGENT_TOKEN", None)
    missing = subprocess.run(
        [PY, "manage.py", "mcp_serve", "--channel", "ops"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode != 0 and "ALEPH_AGENT_TOKEN" in missing.stderr


def _inspector(live, token: str, *args: str) -> dict:
    command = [
        node_bin("mcp-inspector"),
        "--cli",
        f"{live.url}/mcp/",
        "--transport",
        "http",
        "--header",
        f"Authorization: Bearer {token}",
        "--header",
        "X-Aleph-Channel: ops",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_the_inspector_cli_lists_the_tools_and_calls_one(live):
    cast = live.cast
    rest, _ = await rest_tools(live, cast.builder.token)
    listed = await asyncio.to_thread(_inspector, live, cast.builder.token, "--method", "tools/list")
    assert {t["name"] for t in listed["tools"]} == {t["name"] for t in rest}
    called = await asyncio.to_thread(
        _inspector,
        live,
        cast.builder.token,
        "--method",
        "tools/call",
        "--tool-name",
        "note_search",
        "--tool-arg",
        "query=inspector",
    )
    assert called["isError"] is False
    assert called["structuredContent"]["status"] == "succeeded"


async def test_bridged_mcp_tools_are_served_back_out_and_reported_in_health(live):
    cast = live.cast
    await McpServer.objects.acreate(**raw_row())
    await sync_to_async(ToolPermission.objects.create)(scope=Scope.GLOBAL, pattern="raw__*", action="allow")
    async with httpx.AsyncClient(base_url=live.url, timeout=30) as rest:
        for _ in range(200):
            health = (await rest.get("/api/v1/health/")).json()
            servers = {s["name"]: s for s in health["mcp_servers"]}
            if servers.get("raw", {}).get("status") == "connected":
                break
            await asyncio.sleep(0.1)
        assert servers["raw"]["status"] == "connected" and servers["raw"]["tools"] == 2
    async with http_client(live, cast.builder.token, **{"X-Aleph-Channel": "ops"}) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"raw__ok_tool", "raw__a_b"} <= names and "raw__bad_schema" not in names
        result = await client.call_tool("raw__ok_tool", {"x": "round trip"})
        assert not result.is_error
        assert "round trip" in result.content[0].text
    stored = await McpServer.objects.aget(name="raw")
    assert stored.status == "connected"
    # The MCP servers page on the same daphne shows the live state: tools, the quarantined one, the clash.
    browser = DjangoClient()
    await sync_to_async(browser.force_login)(cast.operator.user)
    session = {"sessionid": browser.cookies["sessionid"].value}
    async with httpx.AsyncClient(base_url=live.url, cookies=session, timeout=30) as signed_in:
        page = await signed_in.get("/mcp/servers/")
    assert page.status_code == 200
    html = page.text
    assert 'data-status="connected"' in html and "raw__ok_tool" in html
    assert "bad_schema" in html and "type &#x27;array&#x27;" in html  # quarantined, with the reason
    assert "raw__a_b" in html and "raw:a.b" in html  # the clash and who holds the name


async def test_a_call_needing_approval_completes_after_an_operator_approves_over_rest(live):
    cast = live.cast
    async with http_client(live, cast.builder.token, **{"X-Aleph-Channel": "lab"}) as client:
        # note_write mutates: the Ask tier asks, and the MCP call waits for the operator of lab.
        pending_call = asyncio.ensure_future(client.call_tool("note_write", {"text": "approved over MCP"}))
        operator = {"Authorization": f"Bearer {cast.other_operator.token}"}
        async with httpx.AsyncClient(base_url=live.url, headers=operator, timeout=30) as rest:
            for _ in range(200):
                cards = (await rest.get("/api/v1/approvals/", params={"status": "pending"})).json()
                if cards:
                    break
                await asyncio.sleep(0.1)
            assert [card["tool"] for card in cards] == ["note_write"]
            assert not pending_call.done()
            decided = await rest.post(
                f"/api/v1/approvals/{cards[0]['id']}/decide/", json={"decision": "approve", "scope": "once"}
            )
            assert decided.status_code == 200, decided.text
        result = await asyncio.wait_for(pending_call, 30)
    assert not result.is_error, result.content[0].text
    assert result.structured_content["status"] == "succeeded"
    assert result.structured_content["decision"]["decided_by"] == "operator"
