"""An MCPServer over streamable HTTP behind OAuth, with its own authorization server that approves every request.

`python auth_peer.py` binds 127.0.0.1:0, prints its port, and serves /mcp (401 without a token), the OAuth
metadata, dynamic client registration, /authorize (redirects straight back with a code) and /token.
"""

import asyncio
import secrets
import socket
import time

import uvicorn
from mcp.server.auth.provider import AccessToken, AuthorizationCode, RefreshToken
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthToken
from mcp.types import ToolAnnotations


class ApproveEverything:
    """An in-memory authorization server: every client registers, every authorization is granted at once."""

    def __init__(self) -> None:
        self.clients, self.codes, self.tokens, self.refresh = {}, {}, {}, {}

    async def get_client(self, client_id):
        return self.clients.get(client_id)

    async def register_client(self, client_info):
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client, params):
        code = secrets.token_urlsafe(24)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [],
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        return f"{params.redirect_uri}?code={code}&state={params.state}"

    async def load_authorization_code(self, client, authorization_code):
        return self.codes.get(authorization_code)

    async def exchange_authorization_code(self, client, authorization_code):
        self.codes.pop(authorization_code.code, None)
        return self._issue(client.client_id, authorization_code.scopes, authorization_code.resource)

    async def load_refresh_token(self, client, refresh_token):
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(self, client, refresh_token, scopes):
        self.refresh.pop(refresh_token.token, None)
        return self._issue(client.client_id, scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token):
        return self.tokens.get(token)

    async def revoke_token(self, token):
        self.tokens.pop(getattr(token, "token", ""), None)

    def _issue(self, client_id, scopes, resource):
        access, refresh = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        self.tokens[access] = AccessToken(token=access, client_id=client_id, scopes=scopes, resource=resource)
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource)
        return OAuthToken(access_token=access, token_type="Bearer", expires_in=3600, refresh_token=refresh)


def main() -> None:
    # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets that name it, and without it Nagle holds
    # the response body behind its headers for the client's delayed ACK (~40 ms a call).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = MCPServer(
        "guarded",
        auth_server_provider=ApproveEverything(),
        auth=AuthSettings(
            issuer_url=base,
            resource_server_url=f"{base}/mcp",
            client_registration_options=ClientRegistrationOptions(enabled=True),
            validate_token_resource=False,
        ),
    )

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def secret_sum(a: int, b: int) -> int:
        """Add, for signed-in callers only."""
        return a + b

    print(sock.getsockname()[1], flush=True)
    app = server.streamable_http_app(transport_security=None, host="0.0.0.0")
    asyncio.run(uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on")).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
