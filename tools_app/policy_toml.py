"""Policy as code: aleph.toml in and out, all-or-nothing, naming the line of anything wrong."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import tomli_w
from django.contrib.auth import get_user_model
from django.db import transaction
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from .models import Agent, Channel, Scope, ToolPermission
from .policy_store import policy_state
from .services import ApplicationError, agent_create

Tier = Literal["ask", "auto", "full"]
ActionName = Literal["allow", "ask", "deny"]
PATTERN = re.compile(r"^[A-Za-z0-9_*?.:-]{1,128}$")
NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class EntrySpec(Strict):
    action: ActionName
    note: str = Field(default="", max_length=500)


def _pattern(value: str) -> str:
    if not PATTERN.match(value):
        raise ValueError(f"{value!r} is not a tool name or glob")
    return value


def _entry(value: Any) -> Any:
    """`"pattern" = "deny"` is short for `"pattern" = { action = "deny" }`."""
    return {"action": value} if isinstance(value, str) else value


# Pattern and entry are validated per key, so an error's location (and so its line) names the entry itself.
Permissions = dict[Annotated[str, AfterValidator(_pattern)], Annotated[EntrySpec, BeforeValidator(_entry)]]


class PoliciesSpec(Strict):
    exec_tier: Tier = "ask"
    tool_permissions: Permissions = Field(default_factory=dict)


class AgentSpec(Strict):
    name: str = Field(pattern=NAME)
    exec_tier: Tier | None = None
    parent: str | None = None
    tool_permissions: Permissions = Field(default_factory=dict)


class ChannelSpec(Strict):
    name: str = Field(pattern=NAME)
    kind: Literal["web", "chat", "cron", "heartbeat", "a2a", "api"] = "web"
    unattended: bool = False
    exec_tier: Tier | None = None
    max_tier: Tier | None = None
    approval_timeout_s: int = Field(default=120, ge=1, le=86400)
    operators: list[str] = Field(default_factory=list)
    tool_permissions: Permissions = Field(default_factory=dict)


@dataclass(frozen=True)
class Section:
    """A top-level table another app owns (mcp_servers, network, sandbox): it validates, applies and exports it."""

    name: str
    apply: Callable[[Any], None]
    export: Callable[[], Any]


SECTIONS: dict[str, Section] = {}


def section_register(section: Section) -> None:
    SECTIONS[section.name] = section


class PolicyFileError(ApplicationError):
    def __init__(self, message: str, line: int | None):
        where = f"line {line}: " if line else ""
        super().__init__(f"{where}{message}", code="invalid_policy", detail={"line": line})
        self.line = line


HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
KEY = re.compile(r"""^\s*("(?:[^"\\]|\\.)*"|'[^']*'|[A-Za-z0-9_-]+)\s*=""")


def _line_index(text: str) -> dict[tuple, int]:
    """Map (table path, array index, key) tuples to the line they start on."""
    index: dict[tuple, int] = {}
    arrays: dict[tuple, int] = {}  # an array of tables' location -> the index of its latest element

    def place(parts: tuple) -> tuple:
        """A table path's location: every array of tables along it is followed by its current index."""
        loc: tuple = ()
        for part in parts:
            loc = (*loc, part)
            if loc in arrays:
                loc = (*loc, arrays[loc])
        return loc

    current: tuple = ()
    for number, line in enumerate(text.splitlines(), start=1):
        header = HEADER.match(line)
        if header:
            parts = tuple(p.strip().strip("\"'") for p in header.group(2).split("."))
            if header.group(1) == "[[":
                array = (*place(parts[:-1]), parts[-1])
                arrays[array] = arrays.get(array, -1) + 1
                current = (*array, arrays[array])
            else:
                current = place(parts)
            index.setdefault(current, number)
            continue
        key = KEY.match(line)
        if key:
            index.setdefault((*current, key.group(1).strip("\"'")), number)
    return index


def _locate(index: dict[tuple, int], loc: tuple) -> int | None:
    for end in range(len(loc), 0, -1):
        if loc[:end] in index:
            return index[loc[:end]]
    return None


@dataclass
class PolicyFile:
    policies: PoliciesSpec
    agents: list[AgentSpec]
    channels: list[ChannelSpec]
    sections: dict[str, Any]


def policy_parse(text: str) -> PolicyFile:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        raise PolicyFileError(f"not valid TOML: {exc}", int(match.group(1)) if match else None) from None
    index = _line_index(text)
    known = {"policies", "agents", "channels", *SECTIONS}
    for key in data:
        if key not in known:
            raise PolicyFileError(
                f"unknown section [{key}]; this gateway understands {', '.join(sorted(known))}", _locate(index, (key,))
            )

    def validate(model: type[BaseModel], value: Any, loc: tuple) -> Any:
        try:
            return model.model_validate(value)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            path = (*loc, *error["loc"])
            where = ".".join(str(p) for p in path)
            raise PolicyFileError(f"{where}: {error['msg']}", _locate(index, path)) from None

    def table_list(key: str) -> list:
        value = data.get(key, [])
        if not isinstance(value, list):
            raise PolicyFileError(f"{key} must be an array of tables ([[{key}]])", _locate(index, (key,)))
        return value

    policies = validate(PoliciesSpec, data.get("policies", {}), ("policies",))
    agents = [validate(AgentSpec, v, ("agents", i)) for i, v in enumerate(table_list("agents"))]
    channels = [validate(ChannelSpec, v, ("channels", i)) for i, v in enumerate(table_list("channels"))]
    for kind, specs in (("agent", agents), ("channel", channels)):
        seen: set[str] = set()
        for i, spec in enumerate(specs):
            if spec.name in seen:
                raise PolicyFileError(f"{kind} {spec.name!r} appears twice", _locate(index, (f"{kind}s", i)))
            seen.add(spec.name)
    return PolicyFile(policies, agents, channels, {k: data[k] for k in SECTIONS if k in data})


def _sync_entries(scope: str, target: dict[str, Any], wanted: dict[str, EntrySpec], existing: dict, seen: set) -> None:
    for pattern, spec in wanted.items():
        key = (scope, target.get("agent_id"), target.get("channel_id"), pattern)
        seen.add(key)
        row = existing.get(key)
        if row is None:
            ToolPermission.objects.create(scope=scope, pattern=pattern, action=spec.action, note=spec.note, **target)
        elif row.action != spec.action or row.note != spec.note:
            row.action, row.note = spec.action, spec.note
            row.save(update_fields=["action", "note", "changed_at"])


def _section_apply(section: Section, value: Any, text: str) -> None:
    """Apply another app's section; an error it raised without a line gets the line its dotted path points at."""
    try:
        section.apply(value)
    except PolicyFileError as exc:
        if exc.line is not None:
            raise
        where = exc.message.split(":", 1)[0].split(".")
        path = tuple(int(part) if part.isdigit() else part for part in where)
        if path[0] != section.name:
            path = (section.name,)
        raise PolicyFileError(exc.message, _locate(_line_index(text), path)) from None


@transaction.atomic
def policy_import(*, text: str) -> dict[str, Any]:
    """Apply a whole policy file, or nothing of it. Returns what changed, with new agents' tokens."""
    parsed = policy_parse(text)
    users = {u.username: u for u in get_user_model().objects.all()}
    for i, channel in enumerate(parsed.channels):
        for name in channel.operators:
            if name not in users:
                line = _locate(_line_index(text), ("channels", i, "operators"))
                raise PolicyFileError(f"channels.{i}.operators: no user named {name!r}", line)
    state = policy_state()
    if state.exec_tier != parsed.policies.exec_tier:
        state.exec_tier = parsed.policies.exec_tier
        state.save()
    tokens: dict[str, str] = {}
    agents: dict[str, Agent] = {}
    for spec in parsed.agents:
        agent = Agent.objects.filter(name=spec.name).first()
        if agent is None:
            agent, tokens[spec.name] = agent_create(name=spec.name)
        agents[spec.name] = agent
    for i, spec in enumerate(parsed.agents):
        parent = None
        if spec.parent:
            parent = agents.get(spec.parent) or Agent.objects.filter(name=spec.parent).first()
            if parent is None:
                line = _locate(_line_index(text), ("agents", i, "parent"))
                raise PolicyFileError(f"agents.{i}.parent: no agent named {spec.parent!r}", line)
        agent = agents[spec.name]
        if agent.exec_tier != spec.exec_tier or agent.parent_id != (parent.id if parent else None):
            agent.exec_tier, agent.parent = spec.exec_tier, parent
            agent.save(update_fields=["exec_tier", "parent"])
    channels: dict[str, Channel] = {}
    for spec in parsed.channels:
        fields = spec.model_dump(exclude={"name", "operators", "tool_permissions"})
        channel, created = Channel.objects.get_or_create(name=spec.name, defaults=fields)
        if not created and any(getattr(channel, k) != v for k, v in fields.items()):
            for k, v in fields.items():
                setattr(channel, k, v)
            channel.save()
        wanted_ops = {users[n].id for n in spec.operators}
        if set(channel.operators.values_list("id", flat=True)) != wanted_ops:
            channel.operators.set(wanted_ops)
        channels[spec.name] = channel
    existing = {(p.scope, p.agent_id, p.channel_id, p.pattern): p for p in ToolPermission.objects.all()}
    seen: set = set()
    _sync_entries(Scope.GLOBAL, {}, parsed.policies.tool_permissions, existing, seen)
    for spec in parsed.agents:
        _sync_entries(Scope.AGENT, {"agent_id": agents[spec.name].id}, spec.tool_permissions, existing, seen)
    for spec in parsed.channels:
        _sync_entries(Scope.CHANNEL, {"channel_id": channels[spec.name].id}, spec.tool_permissions, existing, seen)
    removed = [row for key, row in existing.items() if key not in seen]
    for row in removed:
        row.delete()
    for name, section in SECTIONS.items():
        if name in parsed.sections:
            _section_apply(section, parsed.sections[name], text)
    return {
        "agents": len(parsed.agents),
        "channels": len(parsed.channels),
        "entries": len(seen),
        "removed_entries": len(removed),
        "new_agent_tokens": tokens,
    }


def _entries(rows) -> dict[str, Any]:
    return {r.pattern: ({"action": r.action, "note": r.note} if r.note else r.action) for r in rows}


def _toml_value(value: Any) -> str:
    """One value on one line: arrays and tables inline, scalars exactly as tomli_w writes them."""
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }" if value else "{}"
        )
    return tomli_w.dumps({"v": value}).partition(" = ")[2].rstrip("\n")


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_value(key)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def _toml_blocks(path: str, table: dict[str, Any], *, array: bool) -> list[str]:
    """The layout API.md documents: `[[agents]]` blocks, `[x.tool_permissions]` with one entry per line.

    tomli_w alone writes short arrays of tables inline (`agents = [{...}]`), which a person cannot extend by
    appending a `[[agents]]` block or an `[agents.tool_permissions]` table.
    """
    lines = [f"[[{path}]]" if array else f"[{path}]"]
    nested: list[tuple[str, Any]] = []
    for key, value in table.items():
        if isinstance(value, dict) or _is_table_array(value):
            nested.append((key, value))
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    blocks = ["\n".join(lines)] if array or len(lines) > 1 or not nested else []
    for key, value in nested:
        sub = f"{path}.{_toml_key(key)}"
        if key == "tool_permissions" and isinstance(value, dict):
            if value:
                entries = [f"[{sub}]"]
                entries += [f"{_toml_value(pattern)} = {_toml_value(spec)}" for pattern, spec in value.items()]
                blocks.append("\n".join(entries))
        elif isinstance(value, dict):
            blocks.extend(_toml_blocks(sub, value, array=False))
        else:
            for item in value:
                blocks.extend(_toml_blocks(sub, item, array=True))
    return blocks


def _toml_render(document: dict[str, Any]) -> str:
    blocks: list[str] = []
    for name, value in document.items():
        if isinstance(value, dict):
            blocks.extend(_toml_blocks(_toml_key(name), value, array=False))
        elif _is_table_array(value):
            for item in value:
                blocks.extend(_toml_blocks(_toml_key(name), item, array=True))
    return "\n\n".join(blocks) + "\n"


def policy_export() -> str:
    state = policy_state()
    rows = list(ToolPermission.objects.select_related("agent", "channel").order_by("pattern"))
    document: dict[str, Any] = {
        "policies": {
            "exec_tier": state.exec_tier,
            "tool_permissions": _entries(r for r in rows if r.scope == Scope.GLOBAL),
        }
    }
    agents = []
    for agent in Agent.objects.select_related("parent").order_by("name"):
        spec: dict[str, Any] = {"name": agent.name}
        if agent.exec_tier:
            spec["exec_tier"] = agent.exec_tier
        if agent.parent:
            spec["parent"] = agent.parent.name
        spec["tool_permissions"] = _entries(r for r in rows if r.agent_id == agent.id)
        agents.append(spec)
    channels = []
    for channel in Channel.objects.prefetch_related("operators").order_by("name"):
        spec = {"name": channel.name, "kind": channel.kind, "unattended": channel.unattended}
        for key in ("exec_tier", "max_tier"):
            if getattr(channel, key):
                spec[key] = getattr(channel, key)
        spec["approval_timeout_s"] = channel.approval_timeout_s
        spec["operators"] = sorted(u.username for u in channel.operators.all())
        spec["tool_permissions"] = _entries(r for r in rows if r.channel_id == channel.id)
        channels.append(spec)
    document["agents"] = agents
    document["channels"] = channels
    for name, section in SECTIONS.items():
        value = section.export()
        if value:
            document[name] = value
    return _toml_render(document)
