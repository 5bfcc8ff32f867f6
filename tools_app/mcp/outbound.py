"""HTTP MCP servers through the outbound guard: the SDK's httpx2 client rides on the guard's pinned httpx transport."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2

from ..net.client import Outbound
from ..net.guard import AllowList
from .config import ServerSpec


class _Body(httpx2.AsyncByteStream):
    def __init__(self, response: httpx.Response):
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.TimeoutException as exc:
            raise httpx2.ReadTimeout(str(exc)) from exc
        except httpx.HTTPError as exc:
            raise httpx2.ReadError(str(exc)) from exc

    async def aclose(self) -> None:
        await self._response.aclose()


class GuardedTransport(httpx2.AsyncBaseTransport):
    """Hands every httpx2 request to the guard's transport, so each hop is vetted and dials only vetted addresses.

    The httpx2 client above already does what a client does (headers, cookies, redirects, timeouts); a second httpx
    client in between only repeated it, about 0.4 ms a call."""

    def __init__(self, transport: httpx.AsyncBaseTransport):
        self._transport = transport

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        inner = httpx.Request(
            request.method,
            str(request.url),
            headers=list(request.headers.raw),
            content=await request.aread(),
            extensions={"timeout": request.extensions["timeout"]} if "timeout" in request.extensions else None,
        )
        try:
            response = await self._transport.handle_async_request(inner)
        except httpx.TimeoutException as exc:
            raise httpx2.ConnectTimeout(str(exc), request=request) from exc
        except httpx.HTTPError as exc:  # the guard's refusal (SsrfBlocked) lands here, naming the rule
            raise httpx2.ConnectError(str(exc), request=request) from exc
        return httpx2.Response(
            response.status_code, headers=response.headers.raw, stream=_Body(response), request=request
        )

    async def aclose(self) -> None:
        await self._transport.aclose()


def guarded_http_client_factory(outbound: Outbound) -> Any:
    """The manager's HTTP client factory: the global allow list plus the server's own admin-approved entries."""

    async def factory(spec: ServerSpec, auth: httpx2.Auth | None) -> httpx2.AsyncClient:
        allow = await outbound.allow_list()
        own = AllowList.parse(spec.network_allow, skip_invalid=True)
        inner = outbound.transport(AllowList((*allow.entries, *own.entries)))
        return httpx2.AsyncClient(
            transport=GuardedTransport(inner),
            timeout=httpx2.Timeout(30, read=300),
            headers=dict(spec.headers),
            auth=auth,
            trust_env=False,
        )

    return factory
