"""An HTTP MCP server behind OAuth: needs_login, mcp_login, a person signs in, tokens kept encrypted, reconnects."""

import subprocess
from urllib.parse import urlsplit

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.test import Client as DjangoClient

from tests.conftest import make_cast
from tests.mcp_support import PEERS, PY, bridge_open, db_release, eventually, server_add
from tools_app.mcp.oauth import oauth_load
from tools_app.models import McpServer, Scope, ToolPermission


@pytest.fixture
def mcp_cast(transactional_db):
    cast = make_cast()
    ToolPermission.objects.create(scope=Scope.GLOBAL, pattern="mcp_login", action="allow")
    return cast


@pytest.fixture
def guarded_peer():
    process = subprocess.Popen([PY, str(PEERS / "auth_peer.py")], stdout=subprocess.PIPE, text=True)
    port = int(process.stdout.readline())
    yield f"http://127.0.0.1:{port}"
    process.kill()
    process.wait(timeout=10)


async def test_a_server_behind_oauth_is_logged_in_once_and_stays_connected(mcp_cast, guarded_peer):
    bridge = await bridge_open()
    try:
        await server_add(name="guarded", transport="http", url=f"{guarded_peer}/mcp", network_allow=["127.0.0.1"])
        await eventually(lambda: bridge.status("guarded") == "needs_login", what="needs_login")
        assert "login" in bridge.row("guarded")["last_error"]
        assert bridge.registry.get("guarded__secret_sum") is None
        assert bridge.registry.get("mcp_login") is not None  # offered exactly while a server needs a login

        service = await bridge.service(agent_id=mcp_cast.builder.agent.id)
        started = await service.execute("mcp_login", {"server": "guarded"})
        assert started.status == "succeeded", started.as_dict()
        authorize_url = started.result.output["authorize_url"]
        assert authorize_url.startswith(f"{guarded_peer}/authorize?")

        # The person's browser: the authorization server approves and sends it back to Aleph's callback.
        async with httpx.AsyncClient() as browser:
            approved = await browser.get(authorize_url)
        assert approved.status_code == 302
        back = urlsplit(approved.headers["location"])
        assert back.path == "/mcp/servers/oauth/callback/"
        page = await sync_to_async(DjangoClient().get)(f"{back.path}?{back.query}")
        assert page.status_code == 200 and "guarded" in page.content.decode()

        await eventually(lambda: bridge.status("guarded") == "connected", what="connected after the login")
        assert bridge.registry.get("mcp_login") is None
        service = await bridge.service(agent_id=mcp_cast.builder.agent.id)
        summed = await service.execute("guarded__secret_sum", {"a": 20, "b": 22})
        assert summed.result.output["structuredContent"] == {"result": 42}

        stored = await sync_to_async(oauth_load)(name="guarded")
        sealed = bytes(await sync_to_async(lambda: McpServer.objects.get(name="guarded").oauth)())
        assert stored["tokens"]["access_token"] and stored["client_info"]["client_id"]
        assert stored["tokens"]["access_token"].encode() not in sealed  # encrypted at rest
    finally:
        await bridge.manager.stop()

    again = await bridge_open()  # another process (or a restart) reuses the stored login
    try:
        await eventually(lambda: again.status("guarded") == "connected", what="connected with the stored tokens")
    finally:
        await again.manager.stop()
        await db_release()


async def test_a_stale_or_forged_callback_is_refused(mcp_cast):
    page = await sync_to_async(DjangoClient().get)("/mcp/servers/oauth/callback/?code=x&state=forged")
    assert page.status_code == 400
    await db_release()
