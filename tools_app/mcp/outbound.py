"""HTTP MCP servers through the outbound guard: the SDK's httpx2 client rides on the guard's pinned httpx2 transport."""

from __future__ import annotations

from typing import Any

import httpx2

from ..net.client import Outbound
from ..net.guard import AllowList
from .config import ServerSpec


def guarded_http_client_factory(outbound: Outbound) -> Any:
    """The manager's HTTP client factory: the global allow list plus the server's own admin-approved entries."""

    async def factory(spec: ServerSpec, auth: httpx2.Auth | None) -> httpx2.AsyncClient:
        allow = await outbound.allow_list()
        own = AllowList.parse(spec.network_allow, skip_invalid=True)
        return httpx2.AsyncClient(
            transport=outbound.transport_httpx2(AllowList((*allow.entries, *own.entries))),
            timeout=httpx2.Timeout(30, read=300),
            headers=spec.request_headers(),
            auth=auth,
            trust_env=False,
        )

    return factory
