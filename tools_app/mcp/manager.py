"""The MCP manager: keeps enabled servers connected on the server's event loop and offers their tools as a provider."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import anyio
from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import (
    REQUEST_TIMEOUT,
    Implementation,
    ListToolsRequest,
    ListToolsResult,
    PaginatedRequestParams,
    Tool,
    ToolListChangedNotification,
)
from pydantic import ValidationError

from ..chokepoint.base import BaseTool, ToolResult
from ..models import McpStatus
from .bridge import Catalog, catalog_build
from .config import ServerSpec, specs_load, status_store
from .oauth import oauth_provider
from .transport import HttpClientFactory, Watch, stderr_path, tail, transport_open

logger = logging.getLogger(__name__)
T = TypeVar("T")

LISTING_PAGE_CAP = 50


class ConnectionEnded(Exception):
    """The server went away or stopped answering; the supervisor reconnects with backoff."""


@dataclass
class Connection:
    """One live session: what the server advertised and the tools it lists."""

    client: Client
    watch: Watch
    capabilities: dict[str, Any]
    protocol_version: str
    server_info: dict[str, Any]
    tools: list[Tool]


@dataclass
class Entry:
    """One enabled server as the manager tracks it."""

    spec: ServerSpec
    status: str = McpStatus.CONNECTING
    last_error: str = ""
    connected_since: datetime | None = None
    connection: Connection | None = None
    needs_login: bool = False
    refresh: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None
    order: int = 0
    watch: Watch | None = None
    login: asyncio.Future | None = None  # (authorize URL or None, problem) once the login attempt knows
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class McpManager:
    """Connects enabled servers at start-up and on change, reconnects with backoff, and never lets one block another.

    As a registry provider, `get` and `all` read an immutable catalog swapped in whole, so any thread may call them.
    Everything else runs on the one event loop the manager was started on.
    """

    def __init__(
        self,
        *,
        reserved: Callable[[str], bool] = lambda name: False,
        health: dict[str, Any] | None = None,
        http_client_factory: HttpClientFactory | None = None,
        specs_loader: Callable[[], list[ServerSpec]] = specs_load,
        status_writer: Callable[..., None] | None = status_store,
        poll_seconds: float = 2.0,
        backoff_min: float = 0.5,
        backoff_max: float = 30.0,
        connect_timeout: float = 20.0,
        probe_seconds: float = 30.0,
        probe_timeout: float = 10.0,
        data_dir: Path | None = None,
    ):
        self.reserved = reserved
        self.health = health if health is not None else {}
        self.http_client_factory = http_client_factory
        self.specs_loader = specs_loader
        self.status_writer = status_writer
        self.poll_seconds = poll_seconds
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self.connect_timeout = connect_timeout
        self.probe_seconds = probe_seconds
        self.probe_timeout = probe_timeout
        self.data_dir = data_dir or Path(settings.DATA_DIR)
        self._catalog = Catalog()
        self._reset()

    def _reset(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid: int | None = None
        self._main: asyncio.Task | None = None
        self._changed: asyncio.Event | None = None
        self._order = 0
        self._background: set[asyncio.Task] = set()
        self._first_load_done = False

    # -- the registry provider ------------------------------------------------------------------

    def get(self, name: str) -> BaseTool | None:
        return self._catalog.tools.get(name)

    def all(self) -> list[BaseTool]:
        return list(self._catalog.tools.values())

    @property
    def catalog(self) -> Catalog:
        return self._catalog

    # -- life cycle ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._main is not None and not self._main.done() and self._pid == os.getpid()

    def ensure_started(self) -> None:
        """Start on the running loop unless already running on a live one (daphne has no lifespan: first use starts)."""
        loop = asyncio.get_running_loop()
        if self.running and self._loop is loop:
            return
        if self.running and self._loop is not None and self._loop.is_running():
            return
        # A forked process or a closed loop inherits nothing it can use: forget the old tasks, start afresh.
        self._reset()
        self._catalog = Catalog()
        self._loop = loop
        self._pid = os.getpid()
        self._changed = asyncio.Event()
        self._main = loop.create_task(self._run(), name="mcp-manager")

    async def start(self) -> None:
        self.ensure_started()
        await self.settled()

    async def stop(self) -> None:
        """Disconnect every server and stop reconciling (tests and `mcp_serve` end this way)."""
        if self._main is None or self._pid != os.getpid():
            return
        self._main.cancel()
        entries = list(self._entries.values())
        for entry in entries:
            if entry.task is not None:
                entry.task.cancel()
        tasks = [t for t in (self._main, *(e.task for e in entries), *self._background) if t is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        self._entries.clear()
        self._rebuild()
        self._main = None

    def poke(self) -> None:
        """The stored configuration changed: reconcile now rather than at the next poll (safe from any thread)."""
        loop, changed = self._loop, self._changed
        if loop is None or changed is None or loop.is_closed() or self._pid != os.getpid():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(changed.set)

    async def settled(self, timeout: float | None = None) -> None:
        """Wait until no enabled server is still in its first connection attempt (or `timeout` passes)."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.connect_timeout + 5)
        while time.monotonic() < deadline:
            if self._first_load_done and all(e.status != McpStatus.CONNECTING for e in self._entries.values()):
                return
            await asyncio.sleep(0.02)

    async def _run(self) -> None:
        assert self._changed is not None
        while True:
            self._changed.clear()
            try:
                self._reconcile(await sync_to_async(self.specs_loader)())
            except Exception:  # the database being away for a moment must not stop the manager for good
                logger.exception("MCP manager: reading the configured servers failed; keeping the current set")
            self._first_load_done = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.poll_seconds)

    def _reconcile(self, specs: list[ServerSpec]) -> None:
        wanted = {spec.name: spec for spec in specs}
        for name, entry in list(self._entries.items()):
            if wanted.get(name) != entry.spec:
                self._retire(self._entries.pop(name))
        for name, spec in wanted.items():
            if name not in self._entries:
                self._order += 1
                entry = Entry(spec=spec, order=self._order)
                self._entries[name] = entry
                entry.task = asyncio.get_running_loop().create_task(self._supervise(entry), name=f"mcp:{name}")
        self._rebuild()

    def _retire(self, entry: Entry) -> None:
        if entry.task is not None:
            entry.task.cancel()
            self._keep(entry.task)
        entry.connection = None

    def _keep(self, task: asyncio.Task) -> None:
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- one server -----------------------------------------------------------------------------

    async def _supervise(self, entry: Entry) -> None:
        delay = self.backoff_min
        while True:
            started = time.monotonic()
            try:
                await self._connection(entry)
                error = "The server closed the connection."
            except asyncio.CancelledError:
                entry.connection = None
                self._rebuild()
                raise
            except (Exception, BaseExceptionGroup) as exc:  # a peer's failure of any shape is its status, not ours
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    entry.connection = None
                    self._rebuild()
                    raise
                error = self._explain(entry, exc)
            entry.connection = None
            entry.connected_since = None
            login = entry.spec.transport == "http" and entry.needs_login
            await self._set_status(entry, McpStatus.NEEDS_LOGIN if login else McpStatus.ERROR, error)
            _settle(entry.login, None, error)
            if time.monotonic() - started > self.backoff_max:
                delay = self.backoff_min
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(entry.wake.wait(), delay)  # a login request cuts the wait short
            entry.wake.clear()
            delay = min(delay * 2, self.backoff_max)
            await self._set_status(entry, McpStatus.CONNECTING, entry.last_error)

    async def _connection(self, entry: Entry) -> None:
        spec = entry.spec
        watch = Watch()
        entry.needs_login = False
        log_path = stderr_path(self.data_dir, spec.name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        entry.refresh.clear()

        async def on_message(message: Any) -> None:
            if isinstance(message, ToolListChangedNotification):
                entry.refresh.set()

        auth = None
        if spec.transport == "http":
            login = entry.login if entry.login is not None and not entry.login.done() else None

            async def on_authorize(url: str) -> None:
                _settle(login, url, "")

            auth = oauth_provider(name=spec.name, url=spec.url, on_authorize=on_authorize if login else None)
        with log_path.open("w") as errlog:
            transport = transport_open(
                spec=spec, watch=watch, http_client_factory=self.http_client_factory, errlog=errlog, auth=auth
            )
            client = Client(
                transport,
                read_timeout_seconds=self.connect_timeout,
                message_handler=on_message,
                cache=None,
                client_info=_CLIENT_INFO,
            )
            # A server that answers the handshake with something other than MCP fails now, not at the timeout.
            with anyio.CancelScope() as handshake:
                watch.on_garbage = handshake.cancel
                try:
                    await self._session(entry, client, watch)
                finally:
                    entry.needs_login = watch.unauthorized is not None
                    entry.watch = watch
            if handshake.cancelled_caught:
                raise ConnectionEnded("The handshake failed.")

    async def _session(self, entry: Entry, client: Client, watch: Watch) -> None:
        async with client:
            tools = await self._tools(client)
            entry.connection = Connection(
                client=client,
                watch=watch,
                capabilities=client.server_capabilities.model_dump(mode="json", by_alias=True, exclude_none=True),
                protocol_version=client.protocol_version,
                server_info=client.server_info.model_dump(mode="json", exclude_none=True) if client.server_info else {},
                tools=tools,
            )
            entry.connected_since = timezone.now()
            watch.on_garbage = None
            _settle(entry.login, None, "connected")
            entry.login = None
            await self._set_status(entry, McpStatus.CONNECTED, "")
            await self._watch(entry, client, watch)

    async def _watch(self, entry: Entry, client: Client, watch: Watch) -> None:
        """Hold the connection until it ends; refresh the tools on a change notice and probe the server now and then."""
        closed = asyncio.ensure_future(watch.closed.wait())
        try:
            while True:
                refresh = asyncio.ensure_future(entry.refresh.wait())
                done, _ = await asyncio.wait(
                    {closed, refresh}, timeout=self.probe_seconds, return_when="FIRST_COMPLETED"
                )
                refresh.cancel()
                if closed in done:
                    raise ConnectionEnded("The server closed the connection.")
                entry.refresh.clear()
                try:
                    tools = await asyncio.wait_for(self._tools(client), self.probe_timeout)
                except TimeoutError:
                    raise ConnectionEnded(
                        f"The server stopped answering (no tools/list reply in {self.probe_timeout:g} s)."
                    ) from None
                if entry.connection is not None and tools != entry.connection.tools:
                    entry.connection.tools = tools
                    self._rebuild()
        finally:
            closed.cancel()

    async def _tools(self, client: Client) -> list[Tool]:
        """Every page of tools/list; a listing the SDK rejects whole is read raw, so one bad schema hides one tool."""
        tools: list[Tool] = []
        cursor = None
        for _ in range(LISTING_PAGE_CAP):
            try:
                page = await client.session.list_tools(params=PaginatedRequestParams(cursor=cursor))
                tools.extend(page.tools)
                cursor = page.next_cursor
            except ValidationError:
                raw = await _raw_listing(client, cursor)
                listed, sound = _lenient_tools(raw.get("tools", []))
                # The session learns the sound tools' output schemas, as a whole listing would have taught it.
                client.session._absorb_tool_listing(ListToolsResult(tools=sound), complete=False)
                tools.extend(listed)
                cursor = raw.get("nextCursor")
            if not cursor:
                break
        return tools

    def _explain(self, entry: Entry, exc: BaseException) -> str:
        watch = entry.watch
        parts = [_exception_text(exc)]
        if watch is not None and watch.unauthorized is not None:
            parts.append(f"The server requires a login (HTTP 401: {watch.unauthorized[:200]}).")
        if watch is not None and watch.garbage:
            parts.append("It wrote output that is not MCP: " + " | ".join(watch.garbage[:3]))
        if entry.spec.transport == "stdio":
            stderr = tail(stderr_path(self.data_dir, entry.spec.name))
            if stderr:
                parts.append(f"stderr: {stderr}")
        return " ".join(p for p in parts if p)

    async def _set_status(self, entry: Entry, status: str, error: str) -> None:
        entry.status = status
        entry.last_error = error
        self._rebuild()
        if self.status_writer is None or self._entries.get(entry.spec.name) is not entry:
            return
        connection = entry.connection
        try:
            await sync_to_async(self.status_writer)(
                name=entry.spec.name,
                status=status,
                last_error=error,
                capabilities=connection.capabilities if connection else {},
                connected_since=entry.connected_since,
            )
        except Exception:
            logger.exception("MCP manager: recording the status of %s failed", entry.spec.name)

    # -- the catalog ----------------------------------------------------------------------------

    def _rebuild(self) -> None:
        live = sorted((e for e in self._entries.values() if e.connection is not None), key=lambda e: e.order)
        self._catalog = catalog_build(
            manager=self,
            connected=[(e.spec, e.connection) for e in live],
            needs_login=[e.spec.name for e in self._entries.values() if e.status == McpStatus.NEEDS_LOGIN],
            reserved=self.reserved,
        )
        self._publish()

    def _publish(self) -> None:
        self.health["mcp_servers"] = [
            {
                "name": e.spec.name,
                "transport": e.spec.transport,
                "status": e.status,
                "connected_since": e.connected_since.isoformat() if e.connected_since else None,
                "tools": sum(1 for o in self._catalog.origins.values() if o[0] == e.spec.name),
            }
            for e in sorted(self._entries.values(), key=lambda e: e.spec.name)
        ]

    def snapshot(self) -> list[dict[str, Any]]:
        """The live state of each managed server, for the MCP servers page."""
        rows = []
        for entry in sorted(self._entries.values(), key=lambda e: e.spec.name):
            connection = entry.connection
            rows.append(
                {
                    "name": entry.spec.name,
                    "status": entry.status,
                    "last_error": entry.last_error,
                    "connected_since": entry.connected_since,
                    "capabilities": connection.capabilities if connection else {},
                    "protocol_version": connection.protocol_version if connection else "",
                    "server_info": connection.server_info if connection else {},
                    "tools": sorted(n for n, o in self._catalog.origins.items() if o[0] == entry.spec.name),
                }
            )
        return rows

    # -- talking to a server on behalf of a tool --------------------------------------------------

    def connected(self, capability: str | None = None) -> dict[str, Connection]:
        """Connected servers by name, optionally only those advertising `capability` (resources, prompts)."""
        return {
            name: e.connection
            for name, e in self._entries.items()
            if e.connection is not None
            and (capability is None or e.connection.capabilities.get(capability) is not None)
        }

    async def on_loop(self, work: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run `work` on the manager's loop (the sessions live there), from whichever loop the caller is on."""
        loop = self._loop
        if loop is None or not self.running:
            raise MCPUnavailable("mcp manager not configured: it is not running in this process.")
        if asyncio.get_running_loop() is loop:
            return await work()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work(), loop))

    async def tool_call(self, *, server: str, tool: str, arguments: dict[str, Any], timeout: float) -> ToolResult:
        async def work() -> ToolResult:
            entry = self._entries.get(server)
            if entry is None or entry.connection is None:
                return ToolResult.fail("mcp_unavailable", f"MCP server {server} is not connected.")
            try:
                result = await entry.connection.client.call_tool(tool, arguments, read_timeout_seconds=timeout)
            except MCPError as exc:
                if exc.code == REQUEST_TIMEOUT:
                    return ToolResult.fail("timeout", f"MCP server {server} did not answer within {timeout:g} s.")
                return ToolResult.fail("mcp_error", f"MCP server {server}: {exc.message}", code=exc.code)
            except ValidationError as exc:
                return ToolResult.fail(
                    "mcp_error", f"MCP server {server} sent an invalid result: {exc.errors()[0]['msg']}"
                )
            except RuntimeError as exc:  # structured content that breaks the tool's own output schema
                return ToolResult.fail("mcp_error", f"MCP server {server}: {exc}")
            payload = result.model_dump(mode="json", by_alias=True, exclude_none=True)
            if result.is_error:
                text = " ".join(c.get("text", "") for c in payload.get("content", []) if c.get("type") == "text")
                return ToolResult.fail("mcp_tool_error", text or f"{tool} on {server} reported an error.")
            output = {"content": payload.get("content", [])}
            if "structuredContent" in payload:
                output["structuredContent"] = payload["structuredContent"]
            return ToolResult.ok(output)

        try:
            return await self.on_loop(work)
        except MCPUnavailable as exc:
            return ToolResult.fail("not_configured", str(exc))

    async def login(self, *, server: str, wait: float = 30.0) -> tuple[str | None, str]:
        """Start an OAuth login for `server`: (the address a person opens, "") or (None, why there is none)."""

        async def work() -> tuple[str | None, str]:
            entry = self._entries.get(server)
            if entry is None:
                return None, f"No enabled MCP server is named {server!r}."
            if entry.spec.transport != "http":
                return None, f"MCP server {server} runs over stdio: it has no login."
            if entry.connection is not None:
                return None, "connected"
            if entry.login is None or entry.login.done():
                entry.login = asyncio.get_running_loop().create_future()
                entry.wake.set()
            try:
                return await asyncio.wait_for(asyncio.shield(entry.login), wait)
            except TimeoutError:
                return None, f"MCP server {server} did not offer a login within {wait:g} s."

        return await self.on_loop(work)

    async def session_request(
        self, *, server: str, request: Callable[[Client], Awaitable[T]], timeout: float | None = None
    ) -> T:
        """One request to one connected server (resources, prompts), bounded by `timeout` seconds."""

        async def work() -> T:
            entry = self._entries.get(server)
            if entry is None or entry.connection is None:
                raise MCPUnavailable(f"MCP server {server} is not connected.")
            return await asyncio.wait_for(request(entry.connection.client), timeout or entry.spec.call_timeout_s)

        return await self.on_loop(work)


class MCPUnavailable(Exception):
    pass


def _settle(login: asyncio.Future | None, url: str | None, problem: str) -> None:
    if login is not None and not login.done():
        login.set_result((url, problem))


async def _raw_listing(client: Client, cursor: str | None) -> dict[str, Any]:
    # The SDK validates a listing as a whole; the raw reply lets each tool be judged (and quarantined) on its own.
    session = client.session
    data = ListToolsRequest(params=PaginatedRequestParams(cursor=cursor)).model_dump(
        by_alias=True, mode="json", exclude_none=True
    )
    opts: dict[str, Any] = {}
    session._stamp(data, opts)
    return await session._dispatcher.send_raw_request(data["method"], data.get("params"), opts)


def _lenient_tools(raw_tools: list[Any]) -> tuple[list[Tool], list[Tool]]:
    """(every tool as listed, its schema verbatim so the catalog can quarantine it; the tools that validate whole)."""
    listed: list[Tool] = []
    sound: list[Tool] = []
    for raw in raw_tools:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            continue
        schema = raw.get("inputSchema")
        try:
            if not isinstance(schema, dict) or schema.get("type") != "object":
                raise ValueError("not an object schema")
            tool = Tool.model_validate(raw)
        except (ValidationError, ValueError):
            try:
                shell = Tool.model_validate({**raw, "inputSchema": {"type": "object"}})
            except ValidationError:
                shell = Tool(name=raw["name"], input_schema={"type": "object"})
            listed.append(shell.model_copy(update={"input_schema": schema}))
            continue
        listed.append(tool)
        sound.append(tool)
    return listed, sound


def _exception_text(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_exception_text(e) for e in exc.exceptions[:3])
    if isinstance(exc, MCPError):
        return exc.message
    if isinstance(exc, FileNotFoundError):
        return f"The command was not found: {exc.filename or exc}."
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_CLIENT_INFO = Implementation(name="aleph-gateway", version="1.0.0")
