"""`[[mcp_servers]]` in aleph.toml: servers in the file are created or updated, others are left alone."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..models import McpServer
from ..policy_toml import NAME, PolicyFileError, Section, section_register
from .config import config_problems

CHECKED = ("transport", "command", "args", "env", "url", "headers", "network_allow")
FIELDS = ("transport", "command", "args", "env", "url", "headers", "network_allow", "enabled", "call_timeout_s")


class McpServerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(pattern=NAME)
    transport: Literal["stdio", "http"] = "stdio"
    command: str = Field(default="", max_length=500)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    url: str = Field(default="", max_length=2000)
    headers: dict[str, str] = Field(default_factory=dict)
    network_allow: list[str] = Field(default_factory=list)
    enabled: bool = True
    call_timeout_s: int = Field(default=60, ge=1, le=3600)


def mcp_section_apply(value: Any) -> None:
    if not isinstance(value, list):
        raise PolicyFileError("mcp_servers must be an array of tables ([[mcp_servers]])", None)
    specs: list[McpServerSpec] = []
    for i, item in enumerate(value):
        try:
            spec = McpServerSpec.model_validate(item)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in ("mcp_servers", i, *error["loc"]))
            raise PolicyFileError(f"{where}: {error['msg']}", None) from None
        problems = config_problems(**spec.model_dump(include=set(CHECKED)))
        if problems:
            field, message = next(iter(problems.items()))
            raise PolicyFileError(f"mcp_servers.{i}.{field}: {message}", None)
        specs.append(spec)
    names = [spec.name for spec in specs]
    for name in names:
        if names.count(name) > 1:
            raise PolicyFileError(f"mcp server {name!r} appears twice", None)
    for spec in specs:
        wanted = spec.model_dump(include=set(FIELDS))
        row = McpServer.objects.filter(name=spec.name).first()
        if row is None:
            McpServer.objects.create(name=spec.name, **wanted)
        elif any(getattr(row, key) != value for key, value in wanted.items()):
            for key, value in wanted.items():
                setattr(row, key, value)
            row.save()


def mcp_section_export() -> list[dict[str, Any]]:
    servers = []
    for row in McpServer.objects.order_by("name"):
        spec: dict[str, Any] = {"name": row.name, "transport": row.transport}
        for key in FIELDS[1:]:
            value = getattr(row, key)
            if value or key in ("enabled", "call_timeout_s"):
                spec[key] = value
        servers.append(spec)
    return servers


section_register(Section("mcp_servers", mcp_section_apply, mcp_section_export))
