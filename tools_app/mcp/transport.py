"""How the manager reaches a server: stdio or streamable HTTP, with the end of the connection made observable."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

import anyio
import httpx2
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from pydantic import ValidationError

from .config import ServerSpec

# The HTTP client for one server (with its OAuth flow, if any), built by the outbound guard (see outbound.py);
# none means HTTP servers stay off.
HttpClientFactory = Callable[[ServerSpec, httpx2.Auth | None], Awaitable[httpx2.AsyncClient]]


class GuardMissing(RuntimeError):
    pass


class Watch:
    """What the manager learns from the wire: the end of the stream, non-protocol output, an HTTP 401."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.garbage: list[str] = []
        self.unauthorized: str | None = None
        self.on_garbage: Callable[[], Any] | None = None

    def note_garbage(self, item: Exception) -> None:
        if len(self.garbage) < 5:
            errors = item.errors() if isinstance(item, ValidationError) else []
            seen = errors[0].get("input") if errors else None
            text = repr(seen)[:200] if isinstance(seen, str) else f"{type(item).__name__}: {item}"[:200]
            self.garbage.append(text)
        if self.on_garbage is not None:
            self.on_garbage()


class WatchedReadStream:
    """The session's read stream, passed through, telling `watch` when it ends or carries a parse error."""

    def __init__(self, inner: Any, watch: Watch):
        self._inner = inner
        self._watch = watch

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            item = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._watch.closed.set()
            raise
        if isinstance(item, Exception):
            self._watch.note_garbage(item)
        return item

    async def aclose(self) -> None:
        self._watch.closed.set()
        await self._inner.aclose()

    def __aiter__(self) -> WatchedReadStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> WatchedReadStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def watched(inner: Any, watch: Watch) -> AsyncIterator[tuple[Any, Any]]:
    async with inner as (read_stream, write_stream):
        yield WatchedReadStream(read_stream, watch), write_stream


@contextlib.asynccontextmanager
async def transport_open(
    *,
    spec: ServerSpec,
    watch: Watch,
    http_client_factory: HttpClientFactory | None,
    errlog: TextIO,
    auth: httpx2.Auth | None = None,
) -> AsyncIterator[tuple[Any, Any]]:
    """The (read, write) stream pair to `spec`'s server, for exactly as long as the block runs."""
    if spec.transport == "http":
        if http_client_factory is None:
            raise GuardMissing("HTTP MCP servers are reached only through the outbound guard, and none is configured.")
        client = await http_client_factory(spec, auth)

        async def note_unauthorized(response: httpx2.Response) -> None:
            if response.status_code == 401:
                watch.unauthorized = response.headers.get("www-authenticate", "") or "401 Unauthorized"

        client.event_hooks.setdefault("response", []).append(note_unauthorized)
        async with client, watched(streamable_http_client(spec.url, http_client=client), watch) as streams:
            yield streams
        return
    params = StdioServerParameters(command=spec.command, args=list(spec.args), env=spec.environment() or None)
    async with watched(stdio_client(params, errlog=errlog), watch) as streams:
        yield streams


def stderr_path(data_dir: Path, name: str) -> Path:
    """Where a stdio server's stderr goes: its last lines explain a crash on the MCP servers page."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return data_dir / "mcp" / f"{safe}.stderr.log"


def tail(path: Path, limit: int = 600) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return " ".join(handle.read().decode("utf-8", "replace").split())
    except OSError:
        return ""
