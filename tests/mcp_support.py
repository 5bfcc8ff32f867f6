"""Shared MCP test parts: the peers' command lines, an HTTP peer process, and a bridge wired like the gateway's."""

import asyncio
import inspect
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from tools_app.builtin import builtin_tools
from tools_app.chokepoint.registry import ToolRegistry
from tools_app.chokepoint.service import NoApprovalGate, NullRecorder, ScopedToolService
from tools_app.crypto import secret_box
from tools_app.gateway import turn_build
from tools_app.mcp.manager import McpManager
from tools_app.mcp.wiring import mcp_manager_attach
from tools_app.models import McpServer
from tools_app.net.client import Outbound
from tools_app.net.guard import AllowList
from tools_app.policy_store import current_policy

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / "tests" / "mcp_peers"
NODE_BIN = ROOT / "node_modules" / ".bin"
PY = sys.executable


def node_bin(name: str) -> str:
    path = NODE_BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `npm ci` at the repository root (make test does)")
    return str(path)


def everything_row(name: str = "everything") -> dict:
    return {"name": name, "transport": "stdio", "command": node_bin("mcp-server-everything"), "args": ["stdio"]}


def time_row(name: str = "time") -> dict:
    return {
        "name": name,
        "transport": "stdio",
        "command": PY,
        "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
    }


def peer_row(name: str = "peer", **env: str) -> dict:
    return {"name": name, "transport": "stdio", "command": PY, "args": [str(PEERS / "peer.py"), "stdio"], "env": env}


def raw_row(name: str = "raw", **env: str) -> dict:
    return {"name": name, "transport": "stdio", "command": PY, "args": [str(PEERS / "raw_peer.py")], "env": env}


class HttpPeer:
    """peer.py serving streamable HTTP on 127.0.0.1 (a chosen port lets a test restart it in the same place)."""

    def __init__(self, port: int = 0):
        self.process = subprocess.Popen(
            [PY, str(PEERS / "peer.py"), "http", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.port = int(self.process.stdout.readline())
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)


@dataclass
class Bridge:
    registry: ToolRegistry
    manager: McpManager

    async def service(self, *, agent_id: int, channel: str = "ops", session: str | None = None) -> ScopedToolService:
        def build():
            policy = current_policy()
            turn = turn_build(policy=policy, agent_id=agent_id, channel_name=channel, session_key=session)
            return ScopedToolService(
                registry=self.registry, policy=policy, turn=turn, gate=NoApprovalGate(), recorder=NullRecorder()
            )

        return await sync_to_async(build)()

    def status(self, name: str) -> str | None:
        return next((row["status"] for row in self.manager.snapshot() if row["name"] == name), None)

    def row(self, name: str) -> dict:
        return next(row for row in self.manager.snapshot() if row["name"] == name)


async def bridge_open(**options) -> Bridge:
    """A registry of the builtin tools plus an MCP manager, wired as aleph_site.wiring does, with quick timings."""
    registry = ToolRegistry()
    registry.register_all(builtin_tools(vault_box=secret_box(b"aleph-vault")))
    timings = {
        "poll_seconds": 0.2,
        "backoff_min": 0.2,
        "backoff_max": 1.0,
        "connect_timeout": 20.0,
        "probe_seconds": 1.0,
        "probe_timeout": 2.0,
    }
    manager = mcp_manager_attach(registry=registry, outbound=Outbound(allow_source=AllowList), **{**timings, **options})
    registry.freeze()
    await manager.start()
    return Bridge(registry=registry, manager=manager)


async def server_add(**fields) -> McpServer:
    return await McpServer.objects.acreate(**fields)


async def eventually(predicate, timeout: float = 20.0, interval: float = 0.05, what: str = "condition"):
    """Poll `predicate` (sync, or returning an awaitable) until truthy; fail naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


async def db_release() -> None:
    """Close the connections the async ORM opened in asgiref's worker thread, so the test database can be dropped."""
    await sync_to_async(connections.close_all)()
