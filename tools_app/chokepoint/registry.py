"""The registry: every tool the chokepoint can resolve; static tools filled once at start-up, providers attached."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol

from .base import BaseTool

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class RegistryFrozen(RuntimeError):
    pass


class DuplicateTool(ValueError):
    pass


class ToolProvider(Protocol):
    """Tools that come and go at run time (an MCP server's, say); static tools always win a name."""

    def get(self, name: str) -> BaseTool | None: ...

    def all(self) -> list[BaseTool]: ...


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, BaseTool] = {}
        self._providers: list[ToolProvider] = []
        self._frozen = False

    def register(self, tool: BaseTool) -> None:
        if self._frozen:
            raise RegistryFrozen(f"cannot register {tool.name}: the registry is read-only after start-up")
        if not TOOL_NAME.match(tool.name):
            raise ValueError(f"tool name {tool.name!r} must match {TOOL_NAME.pattern}")
        if tool.name in self._tools:
            raise DuplicateTool(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def register_all(self, tools: Iterable[BaseTool]) -> None:
        for tool in tools:
            self.register(tool)

    def attach(self, provider: ToolProvider) -> None:
        """Consult `provider` after the static tools: a static tool keeps its name; the provider reports the clash."""
        if self._frozen:
            raise RegistryFrozen("cannot attach a tool provider: the registry is read-only after start-up")
        self._providers.append(provider)

    def freeze(self) -> ToolRegistry:
        self._frozen = True
        return self

    def is_static(self, name: str) -> bool:
        return name in self._tools

    def get(self, name: str) -> BaseTool | None:
        tool = self._tools.get(name)
        if tool is not None:
            return tool
        for provider in self._providers:
            tool = provider.get(name)
            if tool is not None and tool.name == name and TOOL_NAME.match(name):
                return tool
        return None

    def all(self) -> list[BaseTool]:
        if not self._providers:
            return sorted(self._tools.values(), key=lambda tool: tool.name)
        tools = dict(self._tools)
        for provider in self._providers:
            for tool in provider.all():
                if TOOL_NAME.match(tool.name):
                    tools.setdefault(tool.name, tool)
        return sorted(tools.values(), key=lambda tool: tool.name)

    def __contains__(self, name: str) -> bool:
        return self.get(name) is not None

    def __len__(self) -> int:
        return len(self.all()) if self._providers else len(self._tools)
