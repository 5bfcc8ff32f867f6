"""A server that crashes, hangs or sends garbage: its status says so, its tools go, nobody else waits, it comes back."""

import asyncio
import contextlib
import os
import signal
import time

import pytest
from asgiref.sync import sync_to_async

from tests.conftest import make_cast
from tests.mcp_support import HttpPeer, bridge_open, db_release, eventually, peer_row, raw_row, server_add
from tools_app.models import McpServer, Scope, ToolPermission


@pytest.fixture
def mcp_cast(transactional_db):
    cast = make_cast()
    ToolPermission.objects.create(scope=Scope.GLOBAL, pattern="raw__*", action="allow")
    return cast


@pytest.fixture
async def bridge(mcp_cast):
    opened = await bridge_open(connect_timeout=3.0)
    yield opened
    await opened.manager.stop()
    await db_release()


@pytest.fixture
def flaky(tmp_path):
    mode, pid = tmp_path / "mode", tmp_path / "pid"
    mode.write_text("")
    yield mode, pid
    with contextlib.suppress(Exception):
        os.kill(int(pid.read_text()), signal.SIGKILL)


async def _bystanders_unaffected(bridge, agent_id):
    """Another server's tool and a builtin answer at once while the broken server is broken."""
    service = await bridge.service(agent_id=agent_id)
    for name, arguments in (("raw__ok_tool", {"x": "still here"}), ("note_search", {"query": "anything"})):
        started = time.monotonic()
        outcome = await service.execute(name, arguments)
        assert outcome.status == "succeeded", outcome.as_dict()
        assert time.monotonic() - started < 1.0, f"{name} waited on the broken server"


async def _stored_status(name):
    return await sync_to_async(lambda: McpServer.objects.values_list("status", "last_error").get(name=name))()


async def test_a_crashing_stdio_server_shows_its_error_loses_its_tools_and_comes_back(bridge, mcp_cast, flaky):
    mode, pid_file = flaky
    await server_add(**peer_row("flaky", PEER_MODE_FILE=str(mode), PEER_PID_FILE=str(pid_file)))
    await server_add(**raw_row())
    await eventually(lambda: bridge.status("flaky") == "connected" and bridge.status("raw") == "connected")
    first_pid = int(pid_file.read_text())
    assert bridge.registry.get("flaky__add") is not None

    mode.write_text("crash")
    os.kill(first_pid, signal.SIGKILL)
    await eventually(lambda: bridge.registry.get("flaky__add") is None, what="the crashed server's tools gone")
    await eventually(lambda: "crashing on purpose" in bridge.row("flaky")["last_error"], what="stderr in the error")
    assert bridge.status("flaky") in ("error", "connecting")
    status, error = await _stored_status("flaky")
    assert status in ("error", "connecting") and "crashing on purpose" in error
    assert {r["name"]: r["status"] for r in bridge.manager.health["mcp_servers"]}["flaky"] in ("error", "connecting")
    await _bystanders_unaffected(bridge, mcp_cast.builder.agent.id)

    mode.write_text("")
    await eventually(lambda: bridge.status("flaky") == "connected", what="reconnected once healthy")
    service = await bridge.service(agent_id=mcp_cast.builder.agent.id)
    whoami = await service.execute("flaky__whoami", {})
    assert whoami.status == "succeeded"
    assert int(whoami.result.output["structuredContent"]["result"]) != first_pid


async def test_an_env_reference_is_read_at_connect_time_and_an_unset_one_keeps_the_server_off(
    bridge, mcp_cast, flaky, monkeypatch
):
    _, pid_file = flaky
    monkeypatch.delenv("FLAKY_PID_FILE", raising=False)
    await server_add(**peer_row("flaky", PEER_PID_FILE="${FLAKY_PID_FILE}"))
    await eventually(
        lambda: bridge.status("flaky") is not None and "FLAKY_PID_FILE" in bridge.row("flaky")["last_error"],
        what="the unset variable named",
    )
    assert "not set in Aleph's environment" in bridge.row("flaky")["last_error"]
    assert bridge.status("flaky") in ("error", "connecting") and bridge.registry.get("flaky__add") is None
    assert not pid_file.exists()  # the server was never started
    monkeypatch.setenv("FLAKY_PID_FILE", str(pid_file))
    await eventually(lambda: bridge.status("flaky") == "connected", what="connected once the variable is set")
    assert int(pid_file.read_text()) > 0  # the server received the value, not the reference
    stored = await sync_to_async(lambda: McpServer.objects.get(name="flaky").env)()
    assert stored == {"PEER_PID_FILE": "${FLAKY_PID_FILE}"}  # the database keeps the reference only


async def test_a_hung_stdio_server_is_detected_and_replaced(bridge, mcp_cast, flaky):
    mode, pid_file = flaky
    await server_add(**peer_row("flaky", PEER_MODE_FILE=str(mode), PEER_PID_FILE=str(pid_file)), call_timeout_s=2)
    await server_add(**raw_row())
    await eventually(lambda: bridge.status("flaky") == "connected" and bridge.status("raw") == "connected")
    hung_pid = int(pid_file.read_text())
    service = await bridge.service(agent_id=mcp_cast.builder.agent.id)

    os.kill(hung_pid, signal.SIGSTOP)
    try:
        in_flight = asyncio.ensure_future(service.execute("flaky__add", {"a": 1, "b": 2}))
        await asyncio.sleep(0.1)
        await _bystanders_unaffected(bridge, mcp_cast.builder.agent.id)
        stuck = await asyncio.wait_for(in_flight, 10)
        assert stuck.status == "failed" and stuck.result.error.code in ("timeout", "mcp_error", "mcp_unavailable")
        await eventually(lambda: bridge.registry.get("flaky__add") is None, what="the hung server's tools gone")
        assert "stopped answering" in bridge.row("flaky")["last_error"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(hung_pid, signal.SIGKILL)
    await eventually(lambda: bridge.status("flaky") == "connected", what="a fresh process connected")
    assert int(pid_file.read_text()) != hung_pid


async def test_a_server_that_writes_garbage_is_reported_and_recovers(bridge, mcp_cast, flaky):
    mode, pid_file = flaky
    mode.write_text("garbage")
    await server_add(**peer_row("flaky", PEER_MODE_FILE=str(mode), PEER_PID_FILE=str(pid_file)))
    await server_add(**raw_row())
    await eventually(lambda: bridge.status("raw") == "connected")
    await eventually(lambda: "not MCP" in bridge.row("flaky")["last_error"], what="garbage reported")
    assert "this is not JSON-RPC" in bridge.row("flaky")["last_error"]
    assert not [t for t in bridge.manager.all() if t.name.startswith("flaky__")]
    await _bystanders_unaffected(bridge, mcp_cast.builder.agent.id)
    mode.write_text("")
    await eventually(lambda: bridge.status("flaky") == "connected", what="reconnected once it speaks MCP")
    assert bridge.registry.get("flaky__add") is not None


async def test_an_http_server_that_dies_is_reported_and_reconnected_when_back(bridge, mcp_cast):
    peer = HttpPeer()
    port = peer.port
    try:
        await server_add(name="web", transport="http", url=peer.url, network_allow=["127.0.0.1"])
        await server_add(**raw_row())
        await eventually(lambda: bridge.status("web") == "connected" and bridge.status("raw") == "connected")
        peer.stop()
        await eventually(lambda: bridge.registry.get("web__add") is None, what="the dead server's tools gone")
        assert bridge.status("web") in ("error", "connecting")
        assert bridge.row("web")["last_error"]
        await _bystanders_unaffected(bridge, mcp_cast.builder.agent.id)
        peer = HttpPeer(port)
        await eventually(lambda: bridge.status("web") == "connected", what="reconnected to the revived server")
        service = await bridge.service(agent_id=mcp_cast.builder.agent.id)
        outcome = await service.execute("web__add", {"a": 20, "b": 22})
        assert outcome.result.output["structuredContent"] == {"result": 42}
    finally:
        peer.stop()
