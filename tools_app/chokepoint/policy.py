"""The policy contract: permission entries over three scopes, exec tiers and floors, compiled for speed."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from fnmatch import translate

from .base import CONFIRMATION_REQUIRED_TOOLS, ToolFacts

ALLOW, ASK, DENY = "allow", "ask", "deny"
RANK = {ALLOW: 0, ASK: 1, DENY: 2}
TIERS = ("ask", "auto", "full")
TIER_RANK = {tier: index for index, tier in enumerate(TIERS)}
WILDCARDS = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class Rule:
    """A matching permission entry and the label that names it (`channel:ops:github__*`)."""

    action: str
    label: str
    exact: bool


@dataclass(frozen=True)
class Decision:
    verdict: str
    decided_by: str
    rule: str
    reason: str
    approval: str | None = None
    principal: str | None = None

    def settled(self, **changes: str | None) -> Decision:
        return replace(self, **changes)

    def as_dict(self) -> dict[str, str | None]:
        return {
            "verdict": self.verdict,
            "decided_by": self.decided_by,
            "rule": self.rule,
            "reason": self.reason,
            "approval": self.approval,
        }


class ScopeTable:
    """The entries of one scope: exact names in a dict, globs precompiled and bucketed by literal prefix or suffix."""

    def __init__(self, label_prefix: str, entries: Iterable[tuple[str, str]]):
        self.exact: dict[str, Rule] = {}
        self.by_prefix: dict[str, list[tuple[re.Pattern[str], Rule]]] = {}
        self.by_suffix: dict[str, list[tuple[re.Pattern[str], Rule]]] = {}
        self.loose: list[tuple[re.Pattern[str], Rule]] = []
        for pattern, action in entries:
            if action not in RANK:
                raise ValueError(f"unknown action {action!r} for {label_prefix}{pattern}")
            wildcard = WILDCARDS.search(pattern)
            if wildcard is None:
                self.exact[pattern] = Rule(action, label_prefix + pattern, exact=True)
                continue
            compiled = (re.compile(translate(pattern)), Rule(action, label_prefix + pattern, exact=False))
            prefix = pattern[: wildcard.start()]
            suffix = re.split(r"[*?\]]", pattern)[-1]
            if prefix:
                self.by_prefix.setdefault(prefix, []).append(compiled)
            elif suffix:
                self.by_suffix.setdefault(suffix, []).append(compiled)
            else:
                self.loose.append(compiled)
        for bucket in (*self.by_prefix.values(), *self.by_suffix.values(), self.loose):
            bucket.sort(key=lambda item: -RANK[item[1].action])
        self.prefix_lengths = sorted({len(p) for p in self.by_prefix})
        self.suffix_lengths = sorted({len(s) for s in self.by_suffix})

    def __len__(self) -> int:
        return (
            len(self.exact)
            + len(self.loose)
            + sum(map(len, self.by_prefix.values()))
            + sum(map(len, self.by_suffix.values()))
        )

    def match(self, name: str) -> Rule | None:
        """Within one scope an exact entry beats globs; among matching globs the most restrictive wins."""
        rule = self.exact.get(name)
        if rule is not None:
            return rule
        best: Rule | None = None
        for bucket in self._candidate_buckets(name):
            for regex, candidate in bucket:
                if best is not None and RANK[candidate.action] <= RANK[best.action]:
                    break
                if regex.match(name):
                    best = candidate
                    break
            if best is not None and best.action == DENY:
                return best
        return best

    def _candidate_buckets(self, name: str) -> Iterable[list[tuple[re.Pattern[str], Rule]]]:
        for length in self.prefix_lengths:
            if length > len(name):
                break
            bucket = self.by_prefix.get(name[:length])
            if bucket:
                yield bucket
        for length in self.suffix_lengths:
            if length > len(name):
                break
            bucket = self.by_suffix.get(name[len(name) - length :])
            if bucket:
                yield bucket
        if self.loose:
            yield self.loose


EMPTY_TABLE = ScopeTable("", ())


@dataclass(frozen=True)
class AgentInfo:
    id: int
    name: str
    parent_id: int | None
    exec_tier: str | None
    is_active: bool


@dataclass(frozen=True)
class ChannelInfo:
    id: int
    name: str
    kind: str
    unattended: bool
    exec_tier: str | None
    max_tier: str | None
    approval_timeout_s: int


@dataclass
class CompiledPolicy:
    """Everything a decision needs, built once per policy version and shared by every request."""

    version: str
    global_tier: str
    global_table: ScopeTable = EMPTY_TABLE
    agent_tables: dict[int, ScopeTable] = field(default_factory=dict)
    channel_tables: dict[int, ScopeTable] = field(default_factory=dict)
    agents: dict[int, AgentInfo] = field(default_factory=dict)
    channels: dict[str, ChannelInfo] = field(default_factory=dict)
    agent_tokens: dict[str, int] = field(default_factory=dict)

    def agent_lineage(self, agent_id: int) -> list[AgentInfo]:
        """The agent, then its parent, and so on: a sub-agent is bound by its parents' entries too."""
        lineage: list[AgentInfo] = []
        current = self.agents.get(agent_id)
        while current is not None and len(lineage) < 32:
            lineage.append(current)
            current = self.agents.get(current.parent_id) if current.parent_id else None
        return lineage

    def entry_for(self, tool: str, agent_id: int, channel_id: int) -> Rule | None:
        """Across scopes the most restrictive matching entry wins; on a tie, the most specific scope names it."""
        candidates = [self.channel_tables.get(channel_id, EMPTY_TABLE).match(tool)]
        candidates += [self.agent_tables.get(a.id, EMPTY_TABLE).match(tool) for a in self.agent_lineage(agent_id)]
        candidates.append(self.global_table.match(tool))
        best: Rule | None = None
        for rule in candidates:
            if rule is not None and (best is None or RANK[rule.action] > RANK[best.action]):
                best = rule
        return best

    def tier_for(self, agent_id: int, channel: ChannelInfo, session_tier: str | None) -> tuple[str, str]:
        """The most specific tier wins (session, agent, parents, channel, global); the channel's cap clamps it."""
        tier, source = self.global_tier, "the global setting"
        if channel.exec_tier:
            tier, source = channel.exec_tier, f"channel {channel.name}"
        for agent in reversed(self.agent_lineage(agent_id)):
            if agent.exec_tier:
                tier, source = agent.exec_tier, f"agent {agent.name}"
        if session_tier:
            tier, source = session_tier, "this session"
        if channel.max_tier and TIER_RANK[tier] > TIER_RANK[channel.max_tier]:
            return channel.max_tier, f"{source} asks for {tier}, capped by channel {channel.name}"
        return tier, source


def tier_decision(*, tool: str, facts: ToolFacts | None, tier: str, tier_source: str) -> Decision:
    rule = f"tier:{tier}"
    if facts is None:
        return Decision(
            ASK,
            "tier",
            rule,
            f"Aleph has no facts for {tool}, so it asks under every tier until an admin writes a permission entry.",
        )
    if tier == "ask" and not facts.idempotent:
        return Decision(ASK, "tier", rule, f"The Ask tier ({tier_source}) asks before any call that changes something.")
    if tier == "auto" and facts.requires_approval:
        return Decision(ASK, "tier", rule, f"The Auto tier ({tier_source}) asks before destructive calls.")
    return Decision(ALLOW, "tier", rule, f"The {tier.capitalize()} tier ({tier_source}) runs {tool} without asking.")


def decide(
    *,
    tool: str,
    facts: ToolFacts | None,
    entry: Rule | None,
    tier: str,
    tier_source: str,
    floor: Decision | None = None,
) -> Decision:
    """One decision for one call; each line below is one clause of the policy contract."""
    if entry is not None and entry.action == DENY:
        return Decision(DENY, "entry", entry.label, f"Permission entry {entry.label} denies {tool}.")
    if floor is not None:
        return floor
    if tool in CONFIRMATION_REQUIRED_TOOLS:
        return Decision(ASK, "floor", f"confirmation_required:{tool}", f"{tool} always needs a person's confirmation.")
    if entry is not None and entry.action == ASK:
        return Decision(ASK, "entry", entry.label, f"Permission entry {entry.label} asks before {tool}.")
    if entry is not None:
        return Decision(ALLOW, "entry", entry.label, f"Permission entry {entry.label} allows {tool}.")
    return tier_decision(tool=tool, facts=facts, tier=tier, tier_source=tier_source)


def is_hidden(policy: CompiledPolicy, tool: str, agent_id: int, channel_id: int) -> bool:
    """Deny hides the tool from the model and refuses the call."""
    entry = policy.entry_for(tool, agent_id, channel_id)
    return entry is not None and entry.action == DENY
