"""The /mcp/ endpoint on the same daphne: streamable HTTP for agents (Bearer token, channel by header), else Django."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from ..gateway import gateway
from ..services import person_for_token
from .server import Principal, agent_for_token, principal_var, server_build
from .wiring import mcp_start

logger = logging.getLogger(__name__)
MCP_PATHS = ("/mcp", "/mcp/")
CHANNEL_HEADER = b"x-aleph-channel"
SESSION_HEADER = b"x-aleph-session"


async def _reply(send: Any, status: int, code: str, message: str, headers: list | None = None) -> None:
    body = json.dumps({"error": {"code": code, "message": message, "detail": {}}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class McpEndpoint:
    """Wraps the Django ASGI app: /mcp/ is Aleph's MCP server; every request starts the MCP manager if needed."""

    def __init__(self, django_app: Any):
        self.django_app = django_app
        self._sessions: StreamableHTTPSessionManager | None = None
        self._ready: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: asyncio.Task | None = None
        self._started = False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await self._start_manager()
            if scope["path"] in MCP_PATHS:
                await self.serve(scope, receive, send)
                return
        await self.django_app(scope, receive, send)

    async def _start_manager(self) -> None:
        if self._started:
            return
        try:
            wired = await sync_to_async(gateway)()
            mcp_start(wired)
        except Exception:  # the MCP manager failing to start must not take the rest of the site down with it
            logger.exception("MCP manager did not start; retrying on the next request")
            return
        self._started = True

    async def _session_manager(self) -> StreamableHTTPSessionManager:
        """One stateless session manager per loop, run in a task that lives as long as the server does."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._runner is None or self._runner.done():
            self._loop = loop
            self._sessions = StreamableHTTPSessionManager(app=server_build(), stateless=True)
            self._ready = asyncio.Event()
            self._runner = loop.create_task(self._run(self._sessions, self._ready), name="mcp-endpoint")
        assert self._ready is not None and self._sessions is not None
        await self._ready.wait()
        return self._sessions

    @staticmethod
    async def _run(sessions: StreamableHTTPSessionManager, ready: asyncio.Event) -> None:
        async with sessions.run():
            ready.set()
            await asyncio.Event().wait()

    async def serve(self, scope: dict, receive: Any, send: Any) -> None:
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        host = headers.get(b"host", b"").decode("latin-1")
        domain, _port = split_domain_port(host)
        if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
            await _reply(send, 400, "bad_host", "This host name is not served here.")
            return
        authorization = headers.get(b"authorization", b"").decode("latin-1").split()
        if len(authorization) != 2 or authorization[0].lower() != "bearer":
            await _reply(
                send,
                401,
                "not_authenticated",
                "Send an agent's token: Authorization: Bearer <token>.",
                [(b"www-authenticate", b'Bearer realm="aleph"')],
            )
            return
        token = authorization[1]
        agent = await sync_to_async(agent_for_token)(token)
        if agent is None:
            person = await sync_to_async(person_for_token)(token)
            if person is not None:
                await _reply(send, 403, "permission_denied", "Only an agent's token may use the MCP endpoint.")
            else:
                await _reply(
                    send,
                    401,
                    "not_authenticated",
                    "Unknown or revoked token.",
                    [(b"www-authenticate", b'Bearer realm="aleph", error="invalid_token"')],
                )
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        channel = (
            headers.get(CHANNEL_HEADER, b"").decode("latin-1").strip()
            or (query.get("channel") or [""])[0]
            or settings.ALEPH_MCP_CHANNEL
        )
        if not channel:
            await _reply(send, 400, "channel_required", "Name the channel: X-Aleph-Channel header or ?channel=.")
            return
        session_key = headers.get(SESSION_HEADER, b"").decode("latin-1").strip()[:100] or None
        principal = Principal(agent_id=agent[0], agent_name=agent[1], channel=channel, session_key=session_key)
        sessions = await self._session_manager()
        bound = principal_var.set(principal)
        try:
            await sessions.handle_request(scope, receive, send)
        finally:
            principal_var.reset(bound)
