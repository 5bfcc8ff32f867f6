"""What an MCP server is configured as: validation shared by the admin console and aleph.toml, and the spec snapshot."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..models import McpServer
from ..net.guard import allow_entry_parse

ENV_KEY_LIMIT = 128

# `${NAME}` in an env or header value is NAME from Aleph's own environment, read at connect time, so a secret need not
# sit in aleph.toml, the database or `policy export`. `$${` is a literal `${`.
REFERENCE = re.compile(r"(\$?)\$\{([^}]*)\}")
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Aleph's own settings (its secret key, database and Redis credentials) are never handed to an MCP server.
OWN_VARIABLES = ("ALEPH_", "DJANGO_", "DATABASE_URL", "REDIS_URL")


class ReferenceUnusable(ValueError):
    """A `${NAME}` that cannot be filled in: NAME is not set, or its value would break the header it goes into."""


def reference_problem(value: str) -> str | None:
    """What is wrong with the `${...}` references in one value; None when each names a variable it may read."""
    for escaped, name in REFERENCE.findall(value):
        if escaped:
            continue
        if not VARIABLE.fullmatch(name):
            return f"${{{name}}} must name an environment variable: letters, digits and _, not starting with a digit."
        if name.startswith(OWN_VARIABLES):
            return f"${{{name}}} is one of Aleph's own settings, which are never handed to an MCP server."
    if "${" in REFERENCE.sub("", value):
        return "A ${ is not closed: write ${NAME}, or $${ for a literal ${."
    return None


def expand(where: str, value: str, environ: Mapping[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        escaped, name = match.groups()
        if escaped:
            return match.group(0)[1:]
        if name not in environ:
            raise ReferenceUnusable(f"{where} refers to ${{{name}}}, which is not set in Aleph's environment.")
        return environ[name]

    return REFERENCE.sub(one, value)


def config_problems(
    *, transport: str, command: str, args: Any, env: Any, url: str, headers: Any, network_allow: Any
) -> dict[str, str]:
    """Field name -> what is wrong with it; empty when the configuration can be connected."""
    problems: dict[str, str] = {}
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        problems["args"] = "args must be a list of strings."
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        problems["env"] = "env must map names to string values."
    elif any(not k or len(k) > ENV_KEY_LIMIT or "=" in k or "\0" in k for k in env):
        problems["env"] = "env names must be 1-128 characters without '=' or NUL."
    elif problem := next(filter(None, (reference_problem(v) for v in env.values())), None):
        problems["env"] = problem
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        problems["headers"] = "headers must map header names to string values."
    elif any(not k or any(c in k for c in " :\r\n") or "\n" in v or "\r" in v for k, v in headers.items()):
        problems["headers"] = "A header name has no spaces or colons, and no header holds a line break."
    elif problem := next(filter(None, (reference_problem(v) for v in headers.values())), None):
        problems["headers"] = problem
    if not isinstance(network_allow, list) or not all(isinstance(a, str) for a in network_allow):
        problems["network_allow"] = "network_allow must be a list of addresses, networks or host names."
    else:
        for entry in network_allow:
            try:
                allow_entry_parse(entry)
            except ValueError as exc:
                problems["network_allow"] = str(exc)
                break
    if transport == "stdio":
        if not command.strip():
            problems["command"] = "A stdio server needs the command that starts it."
        if url:
            problems["url"] = "A stdio server has no URL; use transport http for a URL."
    elif transport == "http":
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problems["url"] = "An http server needs an http:// or https:// URL."
        elif parts.username or parts.password:
            problems["url"] = "Put credentials in a header or OAuth, not in the URL."
        if command or args or env:
            problems["command"] = "An http server is not started by Aleph: leave command, args and env empty."
    else:
        problems["transport"] = "transport must be stdio or http."
    if transport == "stdio" and (headers or network_allow):
        problems["headers"] = "headers and network_allow are for http servers."
    return problems


@dataclass(frozen=True)
class ServerSpec:
    """One enabled server's configuration as the manager connects it; a changed spec means a reconnect."""

    id: int
    name: str
    transport: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    url: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    network_allow: tuple[str, ...] = ()
    call_timeout_s: float = 60.0
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_row(cls, row: Any) -> ServerSpec:
        return cls(
            id=row.id,
            name=row.name,
            transport=row.transport,
            command=row.command,
            args=tuple(row.args or ()),
            env=tuple(sorted((row.env or {}).items())),
            url=row.url,
            headers=tuple(sorted((row.headers or {}).items())),
            network_allow=tuple(row.network_allow or ()),
            call_timeout_s=float(row.call_timeout_s),
        )

    def environment(self, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
        """The stdio server's extra environment with its `${NAME}` references filled in; ReferenceUnusable if one is not
        set (the server is not started without it)."""
        return {key: expand(f"env {key}", value, environ) for key, value in self.env}

    def request_headers(self, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
        """The HTTP server's extra headers, references filled in; a value that would carry a line break is refused."""
        headers = {}
        for key, value in self.headers:
            headers[key] = expand(f"header {key}", value, environ)
            if "\r" in headers[key] or "\n" in headers[key]:
                raise ReferenceUnusable(f"header {key} would hold a line break once its references are filled in.")
        return headers

    def target(self) -> str:
        """What the operator recognises the server by: its command line or URL (never its environment)."""
        if self.transport == "http":
            return self.url
        return " ".join([self.command, *self.args])


def specs_load() -> list[ServerSpec]:
    """The enabled servers' specs; a disabled server's stored status says so, whichever process noticed first."""
    stale = McpServer.objects.filter(enabled=False).exclude(status="disabled")
    if stale.exists():  # a read on every poll; a write only when there is something to write
        stale.update(status="disabled", connected_since=None, capabilities={})
    return [ServerSpec.from_row(row) for row in McpServer.objects.filter(enabled=True).order_by("name")]


def status_store(*, name: str, status: str, last_error: str, capabilities: dict, connected_since: Any) -> None:
    """Record the manager's view of one server so the admin console and other processes can read it."""
    McpServer.objects.filter(name=name).update(
        status=status, last_error=last_error[:4000], capabilities=capabilities, connected_since=connected_since
    )
