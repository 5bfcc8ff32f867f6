"""OAuth for HTTP MCP servers: tokens kept encrypted in the database, and a login a person finishes in a browser."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from asgiref.sync import sync_to_async
from django.conf import settings
from django.urls import reverse
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from nacl.exceptions import CryptoError

from ..crypto import secret_box
from ..models import McpServer

LOGIN_WAIT_SECONDS = 600
POLL_SECONDS = 0.25


class LoginRequired(Exception):
    """The server wants an OAuth login and nobody has started one (mcp_login does)."""


class LoginFailed(Exception):
    pass


def oauth_callback_url() -> str:
    return f"{settings.ALEPH_PUBLIC_URL}{reverse('mcp:oauth-callback')}"


def _box():
    return secret_box(b"aleph-mcp-oauth")


def oauth_load(*, name: str) -> dict[str, Any]:
    sealed = McpServer.objects.filter(name=name).values_list("oauth", flat=True).first()
    if not sealed:
        return {}
    try:
        return json.loads(_box().decrypt(bytes(sealed)))
    except (CryptoError, ValueError):  # a changed secret key makes old tokens unreadable: log in again
        return {}


def oauth_store(*, name: str, **values: Any) -> None:
    stored = {**oauth_load(name=name), **values}
    sealed = _box().encrypt(json.dumps(stored).encode())
    McpServer.objects.filter(name=name).update(oauth=sealed)


class OAuthStore:
    """The SDK's TokenStorage for one server, in the database so every server process shares one login."""

    def __init__(self, name: str):
        self.name = name

    async def get_tokens(self) -> OAuthToken | None:
        tokens = (await sync_to_async(oauth_load)(name=self.name)).get("tokens")
        return OAuthToken.model_validate(tokens) if tokens else None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        await sync_to_async(oauth_store)(name=self.name, tokens=tokens.model_dump(mode="json", exclude_none=True))

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        info = (await sync_to_async(oauth_load)(name=self.name)).get("client_info")
        return OAuthClientInformationFull.model_validate(info) if info else None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        info = client_info.model_dump(mode="json", exclude_none=True)
        await sync_to_async(oauth_store)(name=self.name, client_info=info)


def login_begin(*, name: str, state: str) -> None:
    McpServer.objects.filter(name=name).update(oauth_pending={"state": state, "started": time.time()})


def mcp_login_complete(*, state: str, code: str = "", error: str = "") -> str | None:
    """The browser came back from the authorization server: hand the code to whichever process waits for it."""
    if not state:
        return None
    server = McpServer.objects.filter(oauth_pending__state=state).first()
    if server is None:
        return None
    server.oauth_pending = {**server.oauth_pending, "code": code, "error": error}
    McpServer.objects.filter(pk=server.pk).update(oauth_pending=server.oauth_pending)
    return server.name


def _pending(name: str) -> dict[str, Any]:
    return McpServer.objects.filter(name=name).values_list("oauth_pending", flat=True).first() or {}


def _pending_clear(name: str) -> None:
    McpServer.objects.filter(name=name).update(oauth_pending={})


async def code_wait(*, name: str, state: str, timeout: float = LOGIN_WAIT_SECONDS) -> AuthorizationCodeResult:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pending = await sync_to_async(_pending)(name)
        if pending.get("state") != state:
            raise LoginFailed("Another login for this server started; this one was abandoned.")
        if pending.get("error"):
            await sync_to_async(_pending_clear)(name)
            raise LoginFailed(f"The authorization server refused: {pending['error']}")
        if pending.get("code"):
            await sync_to_async(_pending_clear)(name)
            return AuthorizationCodeResult(code=pending["code"], state=state)
        await asyncio.sleep(POLL_SECONDS)
    raise LoginFailed(f"Nobody finished the login within {timeout:g} s.")


def oauth_provider(
    *, name: str, url: str, on_authorize: Callable[[str], Awaitable[None]] | None
) -> OAuthClientProvider:
    """The SDK's OAuth flow for one server. Without `on_authorize` (no login under way) it stops at the redirect."""
    state: dict[str, str] = {}

    async def redirect_handler(authorize_url: str) -> None:
        if on_authorize is None:
            raise LoginRequired("The server requires an OAuth login: an agent may start one with mcp_login.")
        state["value"] = parse_qs(urlsplit(authorize_url).query).get("state", [""])[0]
        await sync_to_async(login_begin)(name=name, state=state["value"])
        await on_authorize(authorize_url)

    async def callback_handler() -> AuthorizationCodeResult:
        return await code_wait(name=name, state=state.get("value", ""))

    return OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="Aleph Gateway",
            redirect_uris=[oauth_callback_url()],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
        ),
        storage=OAuthStore(name),
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )
