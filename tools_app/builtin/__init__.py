"""Builtin tools, one module per tool family, registered in one place."""

from typing import Any

from ..chokepoint.base import BaseTool
from .browser import BROWSER_TOOLS
from .exec import BashExec, CodeExec
from .files import FileOps
from .memory import NoteSearch, NoteWrite
from .vault import VaultStore
from .web import WebFetch

BUILTIN_TOOLS: tuple[type[BaseTool], ...] = (
    NoteWrite,
    NoteSearch,
    VaultStore,
    WebFetch,
    BashExec,
    CodeExec,
    FileOps,
    *BROWSER_TOOLS,
)


def builtin_tools(**dependencies: Any) -> list[BaseTool]:
    """Each tool gets only the dependencies it declares; a missing one makes it answer "<x> not configured"."""
    return [cls(**{name: dependencies.get(name) for name in cls.requires}) for cls in BUILTIN_TOOLS]
