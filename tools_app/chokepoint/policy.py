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


def glob_needle(pattern: str) -> str:
    """The longest run of literal characters in a glob, read as fnmatch reads it: every name it matches contains it."""
    runs, run = [], ""
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "[":
            # fnmatch's bracket set: "[!" and a leading "]" belong to it; without a closing "]" the "[" is literal.
            j = i + 1 if i < n and pattern[i] == "!" else i
            j = j + 1 if j < n and pattern[j] == "]" else j
            while j < n and pattern[j] != "]":
                j += 1
            if j < n:
                runs.append(run)
                run, i = "", j + 1
                continue
        if c in "*?":
            runs.append(run)
            run = ""
        else:
            run += c
    runs.append(run)
    return max(runs, key=len)


# A compiled glob: (rank, needle, regex or None, rule); it matches when `needle in name` and the regex, if any, does.
Glob = tuple[int, str, "re.Pattern[str] | None", Rule]


def glob_compile(pattern: str, rule: Rule, *, prefix: str = "", suffix: str = "") -> Glob:
    """The cheapest test that equals fnmatchcase for this pattern, given the bucket key the name already carries."""
    rank = RANK[rule.action]
    if prefix and not pattern[len(prefix) :].strip("*"):
        return (rank, "", None, rule)
    if suffix and pattern.lstrip("*") == suffix and not WILDCARDS.search(suffix):
        return (rank, "", None, rule)
    middle = pattern.strip("*")
    if pattern.startswith("*") and pattern.endswith("*") and not WILDCARDS.search(middle):
        return (rank, middle, None, rule)
    return (rank, glob_needle(pattern), re.compile(translate(pattern)), rule)


def bucket_best(bucket: list[Glob], name: str, best: Rule | None) -> Rule | None:
    """The most restrictive glob of a bucket (sorted most restrictive first) that beats `best` and matches."""
    best_rank = -1 if best is None else RANK[best.action]
    for rank, needle, regex, rule in bucket:
        if rank <= best_rank:
            break
        if needle in name and (regex is None or regex.match(name)):
            return rule
    return best


class ScopeTable:
    """The entries of one scope: exact names in a dict, globs precompiled and bucketed by literal prefix or suffix.

    Inside a bucket the name already carries the bucket key, so `prefix*` and `*suffix` need no regex, `*word*` is a
    substring test, and any other glob runs its regex only when its longest literal part occurs in the name.
    """

    def __init__(self, label_prefix: str, entries: Iterable[tuple[str, str]]):
        self.exact: dict[str, Rule] = {}
        self.by_prefix: dict[str, list[Glob]] = {}
        self.by_suffix: dict[str, list[Glob]] = {}
        self.loose: list[Glob] = []
        for pattern, action in entries:
            if action not in RANK:
                raise ValueError(f"unknown action {action!r} for {label_prefix}{pattern}")
            wildcard = WILDCARDS.search(pattern)
            if wildcard is None:
                self.exact[pattern] = Rule(action, label_prefix + pattern, exact=True)
                continue
            rule = Rule(action, label_prefix + pattern, exact=False)
            prefix = pattern[: wildcard.start()]
            suffix = re.split(r"[*?\]]", pattern)[-1]
            if prefix:
                self.by_prefix.setdefault(prefix, []).append(glob_compile(pattern, rule, prefix=prefix))
            elif suffix:
                self.by_suffix.setdefault(suffix, []).append(glob_compile(pattern, rule, suffix=suffix))
            else:
                self.loose.append(glob_compile(pattern, rule))
        for bucket in (*self.by_prefix.values(), *self.by_suffix.values(), self.loose):
            bucket.sort(key=lambda glob: -glob[0])
        self.prefix_lengths = sorted({len(p) for p in self.by_prefix})
        self.suffix_lengths = sorted({len(s) for s in self.by_suffix})
        # Each key cut at every shorter bucket length ([] where no bucket sits): a name whose cut is absent can match
        # no longer key either, so a miss stops at its first absent cut instead of trying every length.
        self.prefix_paths: dict[str, list[Glob]] = {
            key[:length]: self.by_prefix.get(key[:length], [])
            for key in self.by_prefix
            for length in self.prefix_lengths
            if length <= len(key)
        }
        self.suffix_paths: dict[str, list[Glob]] = {
            key[len(key) - length :]: self.by_suffix.get(key[len(key) - length :], [])
            for key in self.by_suffix
            for length in self.suffix_lengths
            if length <= len(key)
        }

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
        size = len(name)
        for length in self.prefix_lengths:
            if length > size:
                break
            bucket = self.prefix_paths.get(name[:length])
            if bucket is None:
                break
            if bucket:
                best = bucket_best(bucket, name, best)
                if best is not None and best.action == DENY:
                    return best
        for length in self.suffix_lengths:
            if length > size:
                break
            bucket = self.suffix_paths.get(name[size - length :])
            if bucket is None:
                break
            if bucket:
                best = bucket_best(bucket, name, best)
                if best is not None and best.action == DENY:
                    return best
        if self.loose:
            best = bucket_best(self.loose, name, best)
        return best


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


@dataclass(frozen=True)
class CustomRule:
    """One of the admin's command-policy rules: a regular expression over every command an exec call would run."""

    name: str
    pattern: re.Pattern[str]
    reason: str


@dataclass(frozen=True)
class CommandRules:
    """The admin's command-policy rules, compiled: a block rule refuses the call, a warn rule annotates it."""

    block: tuple[CustomRule, ...] = ()
    warn: tuple[CustomRule, ...] = ()


NO_COMMAND_RULES = CommandRules()


def command_rules_compile(rows: Iterable[tuple[str, str, str, str]]) -> CommandRules:
    """(name, regex, action, reason) rows as stored. A row that does not compile (written past validation) makes a
    rule that matches everything: the floor fails closed."""
    block: list[CustomRule] = []
    warn: list[CustomRule] = []
    for name, regex, action, reason in rows:
        try:
            pattern = re.compile(regex)
        except re.error as exc:
            block.append(CustomRule(name, re.compile(""), f"The command-policy rule {name} is broken ({exc})."))
            continue
        (block if action == "block" else warn).append(CustomRule(name, pattern, reason))
    return CommandRules(tuple(block), tuple(warn))


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
    command_rules: CommandRules = NO_COMMAND_RULES

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
        best: Rule | None = None
        tables = [self.channel_tables.get(channel_id)]
        tables += [self.agent_tables.get(a.id) for a in self.agent_lineage(agent_id)]
        tables.append(self.global_table)
        for table in tables:
            # A scope without entries has no table: skipping it saves a whole match on most calls.
            rule = table.match(tool) if table is not None else None
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
