"""The MCP servers page: configuration from the database, live state from this process's manager."""

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import render

from ..gateway import gateway
from ..models import McpServer
from ..services import person_roles
from .config import ServerSpec
from .oauth import mcp_login_complete
from .wiring import mcp_manager_of

BADGES = {"connected": "ok", "connecting": "warn", "disabled": "", "error": "bad", "needs_login": "warn"}


@login_required
def servers(request):
    if not person_roles(request.user) & {"admin", "operator"}:
        raise PermissionDenied("MCP servers are for admins and operators.")
    manager = mcp_manager_of(gateway())
    live = {row["name"]: row for row in manager.snapshot()} if manager is not None and manager.running else {}
    rows = []
    for server in McpServer.objects.order_by("name"):
        state = live.get(server.name, {})
        status = state.get("status", server.status) if server.enabled else "disabled"
        rows.append(
            {
                "server": server,
                "target": ServerSpec.from_row(server).target(),
                "status": status,
                "badge": BADGES.get(status, ""),
                "last_error": state.get("last_error", server.last_error),
                "connected_since": state.get("connected_since", server.connected_since),
                "capabilities": sorted(state.get("capabilities", server.capabilities) or {}),
                "protocol_version": state.get("protocol_version", ""),
                "tools": state.get("tools", []),
                "env_names": sorted(server.env or {}),
                "header_names": sorted(server.headers or {}),
            }
        )
    catalog = manager.catalog if manager is not None else None
    return render(
        request,
        "mcp/servers.html",
        {
            "rows": rows,
            "live": bool(live) or (manager is not None and manager.running),
            "quarantined": catalog.quarantined if catalog else (),
            "collisions": catalog.collisions if catalog else (),
            "is_admin": "admin" in person_roles(request.user),
        },
    )


def oauth_callback(request):
    """Where an authorization server sends the browser back: the state names the login, and so the server."""
    error = request.GET.get("error_description") or request.GET.get("error", "")
    name = mcp_login_complete(state=request.GET.get("state", ""), code=request.GET.get("code", ""), error=error)
    context = {"server": name, "error": error}
    return render(request, "mcp/oauth_callback.html", context, status=200 if name else 400)
