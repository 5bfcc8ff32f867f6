"""How the gateway gets its MCP manager: attached to the registry once, started on the server's loop at first use."""

from __future__ import annotations

import weakref
from typing import Any

from django.db.models.signals import post_delete, post_save

from ..chokepoint.registry import ToolRegistry
from ..gateway import Gateway
from ..models import McpServer
from ..net.client import Outbound
from .manager import McpManager
from .outbound import guarded_http_client_factory

_managers: weakref.WeakKeyDictionary[ToolRegistry, McpManager] = weakref.WeakKeyDictionary()


def mcp_manager_attach(*, registry: ToolRegistry, outbound: Outbound | None, **options: Any) -> McpManager:
    """Give `registry` an MCP manager as a tool provider; static tools keep their names over any MCP tool."""
    factory = guarded_http_client_factory(outbound) if outbound is not None else None
    manager = McpManager(reserved=registry.is_static, http_client_factory=factory, **options)
    registry.attach(manager)
    _managers[registry] = manager
    post_save.connect(_poke, sender=McpServer, dispatch_uid="mcp_manager_poke_save")
    post_delete.connect(_poke, sender=McpServer, dispatch_uid="mcp_manager_poke_delete")
    return manager


def mcp_manager_of(wired: Gateway) -> McpManager | None:
    return _managers.get(wired.registry)


def mcp_start(wired: Gateway) -> McpManager | None:
    """Start the gateway's manager on the running loop (a no-op once running), reporting into its health."""
    manager = mcp_manager_of(wired)
    if manager is not None:
        manager.health = wired.health
        manager.ensure_started()
    return manager


def _poke(sender: Any, **kwargs: Any) -> None:
    for manager in list(_managers.values()):
        manager.poke()
