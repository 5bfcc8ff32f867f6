"""The compiled policy each server process decides from, rebuilt whenever the stored policy changes."""

from __future__ import annotations

import threading
from collections import defaultdict

from .chokepoint.policy import AgentInfo, ChannelInfo, CompiledPolicy, ScopeTable, command_rules_compile
from .models import Agent, Channel, CommandRule, PolicyState, Scope, ToolPermission, new_policy_version

_lock = threading.Lock()
_compiled: CompiledPolicy | None = None


def policy_state() -> PolicyState:
    state, _ = PolicyState.objects.get_or_create(pk=1)
    return state


def policy_version() -> str:
    version = PolicyState.objects.filter(pk=1).values_list("version", flat=True).first()
    return version if version is not None else policy_state().version


def policy_touch() -> None:
    """Mark the stored policy changed: every process recompiles on its next call."""
    updated = PolicyState.objects.filter(pk=1).update(version=new_policy_version())
    if not updated:
        policy_state()


def policy_compile(version: str) -> CompiledPolicy:
    state = policy_state()
    agents: dict[int, AgentInfo] = {}
    tokens: dict[str, int] = {}
    for id_, name, parent_id, tier, active, token_hash in Agent.objects.values_list(
        "id", "name", "parent_id", "exec_tier", "is_active", "token_hash"
    ):
        agents[id_] = AgentInfo(id_, name, parent_id, tier, active)
        if active:
            tokens[token_hash] = id_
    channels = {
        c.name: ChannelInfo(c.id, c.name, c.kind, c.unattended, c.exec_tier, c.max_tier, c.approval_timeout_s)
        for c in Channel.objects.all()
    }
    agent_names = {a.id: a.name for a in agents.values()}
    channel_names = {c.id: c.name for c in channels.values()}
    global_entries: list[tuple[str, str]] = []
    agent_entries: dict[int, list[tuple[str, str]]] = defaultdict(list)
    channel_entries: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for scope, agent_id, channel_id, pattern, action in ToolPermission.objects.values_list(
        "scope", "agent_id", "channel_id", "pattern", "action"
    ):
        if scope == Scope.GLOBAL:
            global_entries.append((pattern, action))
        elif scope == Scope.AGENT:
            agent_entries[agent_id].append((pattern, action))
        else:
            channel_entries[channel_id].append((pattern, action))
    return CompiledPolicy(
        version=version,
        global_tier=state.exec_tier,
        global_table=ScopeTable("global:", global_entries),
        agent_tables={a: ScopeTable(f"agent:{agent_names[a]}:", e) for a, e in agent_entries.items()},
        channel_tables={c: ScopeTable(f"channel:{channel_names[c]}:", e) for c, e in channel_entries.items()},
        agents=agents,
        channels=channels,
        agent_tokens=tokens,
        command_rules=command_rules_compile(
            CommandRule.objects.order_by("name").values_list("name", "regex", "action", "reason")
        ),
    )


def current_policy() -> CompiledPolicy:
    """One indexed read of the version per call; a full compile only when it changed."""
    global _compiled
    version = policy_version()
    compiled = _compiled
    if compiled is not None and compiled.version == version:
        return compiled
    with _lock:
        if _compiled is None or _compiled.version != version:
            _compiled = policy_compile(version)
        return _compiled


def policy_last() -> CompiledPolicy | None:
    """The policy this process compiled last, without a query: for a check that runs on the event loop and may lag a
    change by one call. Decisions always read current_policy()."""
    return _compiled


def policy_forget() -> None:
    global _compiled
    _compiled = None
