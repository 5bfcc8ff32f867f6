"""Every request a page makes is fulfilled through the SSRF engine's pinned client, or blocked and logged."""

from __future__ import annotations

import asyncio
import html
import http.cookiejar
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from playwright.async_api import Request, Route, WebSocketRoute

from ..net.client import Outbound
from ..net.guard import MAX_REDIRECTS, AllowList, Guard, SsrfBlocked

MAX_BODY_BYTES = 25 * 1024 * 1024
REQUEST_TIMEOUT_S = 30.0
LOG_LIMIT = 500
# Hop-by-hop and transport headers: httpx and the browser each set their own.
DROP_REQUEST_HEADERS = frozenset(
    {"host", "connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer"}
    | {"transfer-encoding", "upgrade", "content-length", "accept-encoding"}
)
DROP_RESPONSE_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "content-encoding", "content-length"}
    | {"trailer", "upgrade"}
)
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
INTERSTITIAL = (
    "<!doctype html><meta charset=utf-8><title>Redirecting</title>"
    '<p>Redirecting to <a href="{href}">{href}</a></p>'
    "<script>addEventListener('load', () => setTimeout(() => location.replace({target}), 0))</script>"
)


class _RejectAll(http.cookiejar.DefaultCookiePolicy):
    """The browser owns cookies: the fetching client must never keep one of its own between requests."""

    def set_ok(self, cookie, request) -> bool:
        return False


@dataclass
class NetworkEntry:
    seq: int
    tab_id: str | None
    method: str
    url: str
    resource_type: str
    started: float
    status: int | None = None
    outcome: str = "pending"
    rule: str | None = None
    reason: str | None = None
    bytes: int = 0
    duration_ms: int | None = None
    redirected_to: str | None = None

    def as_dict(self) -> dict[str, Any]:
        data = {
            "seq": self.seq,
            "tab_id": self.tab_id,
            "method": self.method,
            "url": self.url,
            "type": self.resource_type,
            "outcome": self.outcome,
            "status": self.status,
            "bytes": self.bytes,
            "duration_ms": self.duration_ms,
        }
        for key in ("rule", "reason", "redirected_to"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        return data


@dataclass
class NetworkLog:
    """What the session's pages asked for and what became of it; blocked requests keep their rule."""

    entries: deque[NetworkEntry] = field(default_factory=lambda: deque(maxlen=LOG_LIMIT))
    seq: int = 0
    blocked_total: int = 0

    def begin(self, *, tab_id: str | None, method: str, url: str, resource_type: str) -> NetworkEntry:
        self.seq += 1
        entry = NetworkEntry(self.seq, tab_id, method, url, resource_type, time.monotonic())
        self.entries.append(entry)
        return entry

    def finish(self, entry: NetworkEntry, outcome: str, **values: Any) -> None:
        entry.outcome = outcome
        entry.duration_ms = int((time.monotonic() - entry.started) * 1000)
        for key, value in values.items():
            setattr(entry, key, value)
        if outcome == "blocked":
            self.blocked_total += 1


class _TooLarge(Exception):
    pass


def _request_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in DROP_REQUEST_HEADERS and not k.startswith(":")}


def _response_headers(response: httpx.Response, *, keep_cookies: bool) -> dict[str, str]:
    merged: dict[str, str] = {}
    for name, value in response.headers.multi_items():
        name = name.lower()
        if name in DROP_RESPONSE_HEADERS or (name == "set-cookie" and not keep_cookies):
            continue
        # Playwright splits a fulfilled Set-Cookie on newlines; other repeated headers fold with commas.
        joiner = "\n" if name == "set-cookie" else ", "
        merged[name] = f"{merged[name]}{joiner}{value}" if name in merged else value
    return merged


def _same_origin(a: httpx.URL, b: httpx.URL) -> bool:
    return (a.scheme, a.host, a.port) == (b.scheme, b.host, b.port)


async def _read_capped(response: httpx.Response) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _TooLarge
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise _TooLarge
    return bytes(body)


def interstitial(target: str) -> str:
    """A page that replaces itself with the redirect target, so the browser issues (and we vet) a fresh request."""
    return INTERSTITIAL.format(
        href=html.escape(target, quote=True),
        target=json.dumps(target).replace("</", "<\\/"),
    )


class Interceptor:
    """One per browser context: vets and fetches through the engine, keeps the network log of that context."""

    def __init__(self, *, outbound: Outbound, tab_of: Callable[[Request], Any]):
        self.outbound = outbound
        self.tab_of = tab_of
        self.log = NetworkLog()
        self.allow: AllowList | None = None
        self.guard: Guard | None = None
        self.client: httpx.AsyncClient | None = None
        self._retired: list[httpx.AsyncClient] = []

    def allow_set(self, allow: AllowList) -> None:
        """Called before every tool call with the allow list as it stands; a change builds a new pinned client."""
        if self.client is not None and allow == self.allow:
            return
        if self.client is not None:
            self._retired.append(self.client)
        self.allow = allow
        self.guard = self.outbound.guard(allow)
        self.client = self.outbound.client(
            allow=allow,
            timeout=REQUEST_TIMEOUT_S,
            follow_redirects=False,
            max_redirects=MAX_REDIRECTS,
            cookies=httpx.Cookies(http.cookiejar.CookieJar(policy=_RejectAll())),
        )

    async def aclose(self) -> None:
        clients = [*self._retired, *([self.client] if self.client else [])]
        self._retired, self.client = [], None
        for client in clients:
            await client.aclose()

    async def handle(self, route: Route, request: Request) -> None:
        tab = self.tab_of(request)
        entry = self.log.begin(
            tab_id=tab.id if tab else None, method=request.method, url=request.url, resource_type=request.resource_type
        )
        main_document = tab is not None and request.is_navigation_request() and request.frame.parent_frame is None
        if main_document:
            tab.navigation_requested()
        try:
            await self._fetch_and_fulfil(route, request, entry)
        except SsrfBlocked as exc:
            self.log.finish(entry, "blocked", rule=exc.rule, reason=str(exc))
            await _quietly(route.abort("blockedbyclient"))
        except _TooLarge:
            self.log.finish(entry, "failed", reason=f"the response is larger than {MAX_BODY_BYTES} bytes")
            await _quietly(route.abort("failed"))
        except httpx.TooManyRedirects:
            self.log.finish(entry, "failed", reason=f"more than {MAX_REDIRECTS} redirects")
            await _quietly(route.abort("failed"))
        except httpx.TimeoutException:
            self.log.finish(entry, "failed", reason=f"no complete answer within {REQUEST_TIMEOUT_S:g} s")
            await _quietly(route.abort("timedout"))
        except (httpx.HTTPError, UnicodeError) as exc:
            self.log.finish(entry, "failed", reason=f"{type(exc).__name__}: {exc}")
            await _quietly(route.abort("connectionfailed"))
        except Exception as exc:  # the page or context went away mid-answer: the request simply ends
            if entry.outcome == "pending":
                self.log.finish(entry, "failed", reason=f"{type(exc).__name__}: {exc}")
            await _quietly(route.abort("failed"))
        finally:
            if main_document:
                tab.navigation_answered(entry)

    async def _fetch_and_fulfil(self, route: Route, request: Request, entry: NetworkEntry) -> None:
        client, guard = self.client, self.guard
        if client is None or guard is None:
            raise SsrfBlocked("unpinned", request.url, why="no allow list has been set for this browser session")
        # The static checks name the rule before any resolution; the transport vets and pins every hop again.
        guard.check(request.url)
        headers = _request_headers(await request.all_headers())
        method, content = request.method, request.post_data_buffer
        asked = httpx.URL(request.url)
        document = request.resource_type == "document"
        # A document follows redirects in the page itself (an interstitial page that replaces itself), so its URL,
        # origin and cookies stay right; anything else follows them here, each hop vetted by the transport.
        response = await client.send(
            client.build_request(method, asked, headers=headers, content=content),
            stream=True,
            follow_redirects=not document,
        )
        location = response.headers.get("location")
        if document and location and response.status_code in (307, 308) and method not in ("GET", "HEAD"):
            # Only these redirects keep the method and body, which a page cannot replay: follow them here.
            await response.aclose()
            target = response.url.join(location)
            if not _same_origin(target, asked):
                headers = {k: v for k, v in headers.items() if k.lower() not in ("cookie", "authorization")}
            response = await client.send(
                client.build_request(method, target, headers=headers, content=content),
                stream=True,
                follow_redirects=True,
            )
            location = None
        try:
            if document and location and response.status_code in REDIRECT_STATUSES:
                target = str(response.url.join(location))
                guard.check(target)
                self.log.finish(entry, "redirected", status=response.status_code, redirected_to=target)
                await route.fulfill(
                    status=200,
                    headers={**_response_headers(response, keep_cookies=True), "content-type": "text/html"},
                    body=interstitial(target),
                )
                return
            body = b"" if method == "HEAD" else await _read_capped(response)
        finally:
            await response.aclose()
        # Cookies set by another origin than the one asked (after a redirect) would land on the wrong site.
        keep_cookies = _same_origin(response.url, asked)
        self.log.finish(entry, "ok", status=response.status_code, bytes=len(body))
        await route.fulfill(
            status=response.status_code, headers=_response_headers(response, keep_cookies=keep_cookies), body=body
        )

    async def websocket(self, ws: WebSocketRoute) -> None:
        """WebSockets never reach the network: the engine has no pinned WebSocket client, so they are refused."""
        entry = self.log.begin(tab_id=None, method="GET", url=ws.url, resource_type="websocket")
        self.log.finish(
            entry, "blocked", rule="websocket", reason="WebSocket connections are not carried by the outbound door"
        )
        await _quietly(ws.close(code=1008, reason="blocked by Aleph"))


async def _quietly(awaitable) -> None:
    """Answering a route whose page already went away is not an error worth a crash."""
    try:
        await awaitable
    except Exception:  # the page, context or browser closed while the request was in flight
        return


class ProxySink:
    """Chromium's proxy: a local port that refuses everything, so traffic that slips past interception goes nowhere.

    Redirect hops of fulfilled requests, preconnects and the browser's own background services all
    travel here instead of to the network; each attempt is recorded.
    """

    def __init__(self) -> None:
        self.server: asyncio.AbstractServer | None = None
        self.port: int | None = None
        self.attempts: deque[str] = deque(maxlen=LOG_LIMIT)

    async def start(self) -> int:
        if self.server is None:
            self.server = await asyncio.start_server(self._refuse, "127.0.0.1", 0)
            self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 2)
            self.attempts.append(line.decode("latin-1").strip()[:300])
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
            self.port = None
