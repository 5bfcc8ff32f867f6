"""The pinned transports: every request is vetted, then its connection dials exactly the vetted address.

Two flavours share the vetting and the pin: one for httpx (web_fetch, every other outbound client) and one for httpx2,
the HTTP client the MCP SDK brings, so an HTTP MCP server is reached through the guard without a second client stack.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from types import ModuleType
from typing import ClassVar

import httpcore
import httpcore2
import httpx
import httpx2

from .guard import Guard, SsrfBlocked, Target


@dataclass(frozen=True)
class Pin:
    """The vetted addresses for the one origin the current request may connect to."""

    host: str
    port: int
    addresses: tuple[str, ...]


MAX_CACHED_NAMES = 256
DEFAULT_LIMITS = httpx.Limits(max_connections=20, max_keepalive_connections=10, keepalive_expiry=5.0)

# httpcore opens a request's connection in the task that sent the request, so a context variable carries its pin.
_pin: ContextVar[Pin | None] = ContextVar("aleph_outbound_pin", default=None)


# A failed dial to one vetted address moves on to the next; both httpcore flavours' errors mean the same.
CONNECT_FAILURES = (httpcore.ConnectError, httpcore.ConnectTimeout, httpcore2.ConnectError, httpcore2.ConnectTimeout)


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """A network backend reduced to dialing the vetted addresses; TLS SNI and Host keep the name. It serves httpcore
    and httpcore2 pools alike (their backends share one interface); `connector` is the flavour's real backend."""

    def __init__(self, connector: httpcore.AsyncNetworkBackend):
        self.connector = connector

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        pin = _pin.get()
        if pin is None or (pin.host, pin.port) != (host, port):
            raise SsrfBlocked("unpinned", f"{host}:{port}", host=host)
        failure: Exception | None = None
        for address in pin.addresses:
            try:
                return await self.connector.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except CONNECT_FAILURES as exc:
                failure = exc
        raise failure or httpcore.ConnectError(f"no address to dial for {host}")

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise SsrfBlocked("unix_socket", f"unix:{path}")

    async def sleep(self, seconds: float) -> None:
        await self.connector.sleep(seconds)


class _Pinning:
    """What both transports share: a pool whose backend dials only pinned addresses (no proxy, no unix socket, no
    retries), and the vetting of each request: check the URL, resolve it (answers reused for a keep-alive window) and
    pin the request's connection to the vetted addresses while the pool handles it. `core` is httpcore or httpcore2.
    The parent transport's __init__ is skipped on purpose: it would build its pool from proxy settings."""

    core: ClassVar[ModuleType]

    def __init__(
        self,
        *,
        guard: Guard,
        ssl_context: ssl.SSLContext,
        connector: httpcore.AsyncNetworkBackend | httpcore2.AsyncNetworkBackend | None = None,
        limits: httpx.Limits = DEFAULT_LIMITS,
    ):
        self.guard = guard
        self._answers: dict[tuple[str, int], tuple[float, tuple[str, ...]]] = {}
        self._answer_ttl = limits.keepalive_expiry or 0.0
        self._pool = self.core.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            http1=True,
            http2=False,
            retries=0,
            network_backend=PinnedBackend(connector or self.core.AnyIOBackend()),
        )

    async def _addresses(self, target: Target) -> tuple[str, ...]:
        """Vetted answers are reused within the keep-alive window, as a pooled connection to them would be."""
        key = (target.host.name, target.port)
        now = time.monotonic()
        cached = self._answers.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        addresses = await self.guard.resolve(target)
        if len(self._answers) >= MAX_CACHED_NAMES:
            self._answers.clear()
        self._answers[key] = (now + self._answer_ttl, addresses)
        return addresses

    async def _pin_for(self, url: httpx.URL | httpx2.URL) -> Token[Pin | None]:
        target = self.guard.check_url(url)
        addresses = await self._addresses(target)
        return _pin.set(Pin(url.raw_host.decode("ascii"), target.port, addresses))


class GuardedTransport(_Pinning, httpx.AsyncHTTPTransport):
    """httpx's transport over the pinned pool."""

    core = httpcore

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        token = await self._pin_for(request.url)
        try:
            return await super().handle_async_request(request)
        finally:
            _pin.reset(token)


class GuardedHttpx2Transport(_Pinning, httpx2.AsyncHTTPTransport):
    """The same pinned pool for httpx2 (the MCP SDK's client). A refusal surfaces as httpx2's ConnectError carrying
    the guard's message (rule and all), which is what the SDK and the MCP servers page report."""

    core = httpcore2

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            token = await self._pin_for(request.url)
        except httpx.HTTPError as exc:  # SsrfBlocked, or the resolver's failure
            raise httpx2.ConnectError(str(exc), request=request) from exc
        try:
            return await super().handle_async_request(request)
        except SsrfBlocked as exc:  # the backend's own refusal of an unpinned dial
            raise httpx2.ConnectError(str(exc), request=request) from exc
        finally:
            _pin.reset(token)
