"""The registry: every tool the chokepoint can resolve, filled once at start-up."""

from __future__ import annotations

import re
from collections.abc import Iterable

from .base import BaseTool

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class RegistryFrozen(RuntimeError):
    pass


class DuplicateTool(ValueError):
    pass


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, BaseTool] = {}
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

    def freeze(self) -> ToolRegistry:
        self._frozen = True
        return self

    def get(self, name: str) -> BaseTool | None:
        return self._tools.get(name)

    def all(self) -> list[BaseTool]:
        return sorted(self._tools.values(), key=lambda tool: tool.name)

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)
