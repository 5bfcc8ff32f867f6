"""The one outbound HTTP door: every part of Aleph that fetches a URL gets its client from `Outbound`."""

from __future__ import annotations

import functools
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpcore
import httpcore2
import httpx
from asgiref.sync import sync_to_async

from .guard import MAX_REDIRECTS, AllowList, Guard, Resolver, Target, system_resolve
from .transport import GuardedHttpx2Transport, GuardedTransport


@dataclass
class Outbound:
    """Builds guarded httpx clients; the allow list source, resolver, connector and TLS trust are injectable."""

    allow_source: Callable[[], AllowList] = AllowList
    resolver: Resolver = system_resolve
    connector: httpcore.AsyncNetworkBackend | httpcore2.AsyncNetworkBackend | None = None
    verify: ssl.SSLContext | bool = True

    @functools.cached_property
    def ssl_context(self) -> ssl.SSLContext:
        """Loaded once: reading the CA bundle costs milliseconds, a client per call must not pay it."""
        return httpx.create_ssl_context(verify=self.verify, trust_env=False)

    async def allow_list(self) -> AllowList:
        """The current allow list (the source may read the database, so it runs off the event loop)."""
        return await sync_to_async(self.allow_source)()

    def guard(self, allow: AllowList) -> Guard:
        return Guard(allow=allow, resolver=self.resolver)

    def transport(self, allow: AllowList) -> GuardedTransport:
        """The guarded transport alone, for a client library of its own (the MCP SDK's httpx2) to send through."""
        return GuardedTransport(guard=self.guard(allow), ssl_context=self.ssl_context, connector=self.connector)

    def transport_httpx2(self, allow: AllowList) -> GuardedHttpx2Transport:
        """The same guarded transport for httpx2, the MCP SDK's HTTP client."""
        return GuardedHttpx2Transport(guard=self.guard(allow), ssl_context=self.ssl_context, connector=self.connector)

    def client(
        self,
        *,
        allow: AllowList,
        timeout: float | httpx.Timeout = 30.0,
        follow_redirects: bool = True,
        max_redirects: int = MAX_REDIRECTS,
        headers: dict[str, str] | None = None,
        **options: Any,
    ) -> httpx.AsyncClient:
        """A client whose every request and redirect hop is vetted and pinned; environment proxies never apply."""
        if not 0 <= max_redirects <= MAX_REDIRECTS:
            raise ValueError(f"max_redirects must be 0-{MAX_REDIRECTS}")
        for forbidden in ("transport", "mounts", "proxy", "trust_env", "verify"):
            if forbidden in options:
                raise TypeError(f"{forbidden} cannot be set on an outbound client: the guard owns it")
        return httpx.AsyncClient(
            transport=self.transport(allow),
            trust_env=False,
            timeout=timeout,
            follow_redirects=follow_redirects,
            max_redirects=max_redirects,
            headers=headers,
            **options,
        )

    async def open(self, **options: Any) -> httpx.AsyncClient:
        """A client built from the allow list as it stands now."""
        return self.client(allow=await self.allow_list(), **options)

    async def vet(self, raw: str) -> tuple[Target, tuple[str, ...]]:
        """For callers that dial by other means (a browser): the checked target and the only addresses to use."""
        return await self.guard(await self.allow_list()).vet(raw)
