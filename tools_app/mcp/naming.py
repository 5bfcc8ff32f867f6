"""The one source of naming truth for bridged MCP tools, their facts from annotations, and `<server>:<rest>` ids."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import jsonschema

from ..chokepoint.base import READ_ONLY, ToolFacts

NAME_LIMIT = 64
SEPARATOR = "__"
UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def mcp_tool_name(*, server: str, tool: str) -> str:
    """`<server>__<tool>`: a redundant `<server>:` prefix stripped, unsafe characters mapped to `_`, 64 at most."""
    prefix = f"{server}:"
    if tool.startswith(prefix) and len(tool) > len(prefix):
        tool = tool[len(prefix) :]
    return UNSAFE.sub("_", f"{server}{SEPARATOR}{tool}")[:NAME_LIMIT]


def schema_problem(schema: Any) -> str | None:
    """Why an input schema cannot be offered to a model (its tool is quarantined), or None when it can."""
    if not isinstance(schema, dict):
        return "its input schema is not a JSON object"
    if schema.get("type") != "object":
        return f'its input schema has type {schema.get("type")!r}; a tool takes an object ("type": "object")'
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"its input schema is not valid JSON Schema: {exc.message}"
    return None


def facts_from_annotations(annotations: Any) -> ToolFacts | None:
    """MCP hints as the exec tier reads them; no hints at all means unknown facts, which ask under every tier."""
    if annotations is None:
        return None
    read_only = annotations.read_only_hint
    destructive = annotations.destructive_hint
    idempotent = annotations.idempotent_hint
    if read_only is None and destructive is None and idempotent is None:
        return None
    if read_only:
        return READ_ONLY
    # MCP's default: a tool that is not read-only may be destructive unless it says otherwise.
    return ToolFacts(idempotent=bool(idempotent), requires_approval=destructive is not False)


def prefixed_resolve(*, ident: str, servers: Iterable[str]) -> tuple[str, str] | None:
    """Split `<server>:<rest>` by the longest server name that prefixes it (`gh:sub:x` is `gh:sub`'s, never `gh`'s)."""
    best = None
    for name in servers:
        if ident.startswith(f"{name}:") and (best is None or len(name) > len(best)):
            best = name
    if best is None:
        return None
    return best, ident[len(best) + 1 :]
