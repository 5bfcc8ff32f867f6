"""The policy contract of DESIGN.md, one table row per clause, through the real chokepoint."""

from dataclasses import dataclass, field

import pytest
from asgiref.sync import async_to_sync

from tools_app.chokepoint.base import DESTRUCTIVE, MUTATING, READ_ONLY, ToolArgs, ToolFacts, ToolResult, TypedTool
from tools_app.chokepoint.policy import ScopeTable
from tools_app.chokepoint.registry import ToolRegistry
from tools_app.chokepoint.service import NullRecorder, ScopedToolService, Settlement
from tools_app.gateway import turn_build
from tools_app.models import Agent, Channel, PolicyState, Session, ToolCall, ToolPermission, new_policy_version
from tools_app.policy_store import current_policy


class Args(ToolArgs):
    pass


def fake_tool(tool_name: str, tool_facts: ToolFacts | None) -> TypedTool:
    class Fake(TypedTool):
        name = tool_name
        description = f"test tool {tool_name}"
        facts = tool_facts
        Args = globals()["Args"]

        async def call(self, args, ctx):
            return ToolResult.ok({"ran": tool_name})

    return Fake()


TOOLS = {
    "reader": READ_ONLY,
    "writer": MUTATING,
    "wiper": DESTRUCTIVE,
    "mystery": None,
    "git_push": MUTATING,
    "github__create_issue": MUTATING,
    "bash_exec": DESTRUCTIVE,
    "vault_store": DESTRUCTIVE,
    "policy_import": MUTATING,
}


class ApprovingGate:
    """An operator who approves everything, so a row can tell "asked" from "allowed"."""

    def __init__(self):
        self.asked: list[str] = []

    async def standing_grant(self, pending):
        return None

    async def request(self, pending):
        self.asked.append(pending.tool)
        return Settlement(approved=True, decided_by="operator", reason="approved in test", principal="olive")


@dataclass
class Row:
    id: str
    tool: str
    expect: tuple[str, str, str]  # verdict, decided_by, rule
    entries: list[tuple[str, str, str]] = field(default_factory=list)  # (scope, pattern, action)
    global_tier: str = "ask"
    agent_tier: str | None = None
    channel_tier: str | None = None
    max_tier: str | None = None
    session_tier: str | None = None
    channel: str = "ops"


ROWS = [
    # Within one scope an exact entry beats globs.
    Row(
        "exact-beats-glob",
        "bash_exec",
        ("allow", "entry", "global:bash_exec"),
        entries=[("global", "bash_exec", "allow"), ("global", "bash_*", "deny")],
    ),
    Row(
        "exact-ask-beats-glob-allow",
        "writer",
        ("ask", "entry", "global:writer"),
        entries=[("global", "writer", "ask"), ("global", "w*", "allow")],
    ),
    # Among matching globs the most restrictive wins.
    Row(
        "globs-most-restrictive",
        "git_push",
        ("deny", "entry", "global:*_push"),
        entries=[("global", "git*", "allow"), ("global", "*_push", "deny")],
    ),
    Row(
        "globs-ask-over-allow",
        "github__create_issue",
        ("ask", "entry", "agent:builder:github__*"),
        entries=[("agent", "github__*", "ask"), ("agent", "*issue", "allow")],
    ),
    # Across scopes the most restrictive matching value wins.
    Row(
        "scopes-channel-deny",
        "writer",
        ("deny", "entry", "channel:ops:writer"),
        entries=[("global", "writer", "allow"), ("agent", "writer", "ask"), ("channel", "writer", "deny")],
    ),
    Row(
        "scopes-global-deny",
        "writer",
        ("deny", "entry", "global:writer"),
        entries=[("global", "writer", "deny"), ("agent", "writer", "allow"), ("channel", "writer", "allow")],
    ),
    Row(
        "scopes-agent-ask",
        "reader",
        ("ask", "entry", "agent:builder:reader"),
        entries=[("global", "reader", "allow"), ("agent", "reader", "ask")],
    ),
    Row(
        "scopes-glob-vs-exact",
        "github__create_issue",
        ("deny", "entry", "global:github__*"),
        entries=[("global", "github__*", "deny"), ("channel", "github__create_issue", "allow")],
    ),
    # An explicit entry beats the tier.
    Row(
        "allow-beats-ask-tier",
        "writer",
        ("allow", "entry", "global:writer"),
        entries=[("global", "writer", "allow")],
        global_tier="ask",
    ),
    Row(
        "ask-entry-under-full",
        "reader",
        ("ask", "entry", "channel:ops:reader"),
        entries=[("channel", "reader", "ask")],
        global_tier="full",
    ),
    # Exec tiers read ToolFacts.
    Row("ask-tier-read-only-runs", "reader", ("allow", "tier", "tier:ask")),
    Row("ask-tier-mutating-asks", "writer", ("ask", "tier", "tier:ask")),
    Row("auto-tier-mutating-runs", "writer", ("allow", "tier", "tier:auto"), global_tier="auto"),
    Row("auto-tier-destructive-asks", "wiper", ("ask", "tier", "tier:auto"), global_tier="auto"),
    Row("full-tier-destructive-runs", "wiper", ("allow", "tier", "tier:full"), global_tier="full"),
    # Fail closed: unknown facts ask under every tier, until an entry names the tool.
    Row("unknown-asks-under-ask", "mystery", ("ask", "tier", "tier:ask")),
    Row("unknown-asks-under-auto", "mystery", ("ask", "tier", "tier:auto"), global_tier="auto"),
    Row("unknown-asks-under-full", "mystery", ("ask", "tier", "tier:full"), global_tier="full"),
    Row(
        "unknown-with-allow-entry-runs",
        "mystery",
        ("allow", "entry", "global:mystery"),
        entries=[("global", "mystery", "allow")],
        global_tier="full",
    ),
    # The most specific tier wins; the channel's cap clamps it.
    Row("agent-tier-over-global", "writer", ("allow", "tier", "tier:auto"), agent_tier="auto"),
    Row("agent-tier-over-channel", "wiper", ("allow", "tier", "tier:full"), agent_tier="full", channel_tier="ask"),
    Row("session-tier-over-agent", "writer", ("ask", "tier", "tier:ask"), agent_tier="full", session_tier="ask"),
    Row("channel-cap-clamps", "wiper", ("ask", "tier", "tier:auto"), agent_tier="full", max_tier="auto"),
    Row("channel-tier-when-agent-silent", "writer", ("allow", "tier", "tier:auto"), channel_tier="auto"),
    # Floors: confirmation-required tools ask even under Full with an allow entry; only a deny entry stops them earlier.
    Row(
        "confirmation-floor-beats-allow",
        "vault_store",
        ("ask", "floor", "confirmation_required:vault_store"),
        entries=[("global", "vault_store", "allow")],
        global_tier="full",
    ),
    Row(
        "confirmation-floor-deny-entry",
        "vault_store",
        ("deny", "entry", "agent:builder:vault_store"),
        entries=[("agent", "vault_store", "deny")],
        global_tier="full",
    ),
    # An agent can never change the settings that gate it.
    Row(
        "self-protection-floor",
        "policy_import",
        ("deny", "floor", "self_protection:policy_import"),
        entries=[("global", "policy_import", "allow")],
        global_tier="full",
    ),
]


def _apply(row: Row, cast) -> Session | None:
    PolicyState.objects.update_or_create(pk=1, defaults={"exec_tier": row.global_tier})
    Agent.objects.filter(pk=cast.builder.agent.pk).update(exec_tier=row.agent_tier)
    Channel.objects.filter(pk=cast.ops.pk).update(exec_tier=row.channel_tier, max_tier=row.max_tier)
    for scope, pattern, action in row.entries:
        target = (
            {"agent": cast.builder.agent} if scope == "agent" else {"channel": cast.ops} if scope == "channel" else {}
        )
        ToolPermission.objects.create(scope=scope, pattern=pattern, action=action, **target)
    PolicyState.objects.filter(pk=1).update(version=new_policy_version())
    if row.session_tier:
        return Session.objects.create(agent=cast.builder.agent, key="s1", exec_tier=row.session_tier)
    return None


def service_for(cast, *, channel: str = "ops", session: str | None = None, gate=None) -> ScopedToolService:
    registry = ToolRegistry()
    registry.register_all(fake_tool(name, facts) for name, facts in TOOLS.items())
    policy = current_policy()
    turn = turn_build(policy=policy, agent_id=cast.builder.agent.id, channel_name=channel, session_key=session)
    return ScopedToolService(
        registry=registry.freeze(), policy=policy, turn=turn, gate=gate or ApprovingGate(), recorder=NullRecorder()
    )


@pytest.mark.django_db
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_policy_contract(row: Row, cast):
    session = _apply(row, cast)
    gate = ApprovingGate()
    service = service_for(cast, channel=row.channel, session=session.key if session else None, gate=gate)

    explained, trace = service.explain(row.tool, {})
    assert (explained.verdict, explained.decided_by, explained.rule) == row.expect
    assert explained.reason

    outcome = async_to_sync(service.execute)(row.tool, {})
    verdict, decided_by, rule = row.expect
    assert outcome.decision.verdict == verdict
    assert outcome.decision.rule == rule
    if verdict == "allow":
        assert (outcome.status, outcome.decision.decided_by, gate.asked) == ("succeeded", decided_by, [])
    elif verdict == "ask":
        assert gate.asked == [row.tool], "an ask must reach the approval desk"
        assert (outcome.status, outcome.decision.decided_by) == ("succeeded", "operator")
    else:
        assert (outcome.status, outcome.decision.decided_by, gate.asked) == ("denied", decided_by, [])
        assert outcome.result is None
    stored = ToolCall.objects.get(id=outcome.id)
    assert (stored.verdict, stored.rule, stored.status) == (verdict, rule, outcome.status)


@pytest.mark.django_db
def test_deny_hides_from_list_describe_and_schema(cast):
    ToolPermission.objects.create(scope="channel", channel=cast.ops, pattern="git*", action="deny")
    ToolPermission.objects.create(scope="agent", agent=cast.builder.agent, pattern="wiper", action="deny")
    service = service_for(cast)
    names = {d.name for d in service.list()}
    assert "git_push" not in names and "wiper" not in names
    assert {"reader", "writer", "mystery"} <= names
    assert service.describe("git_push") is None and service.describe("wiper") is None
    assert service.describe("reader") is not None
    for fmt in ("openai", "anthropic", "mcp"):
        schema_text = str(service.dispatcher_schema(fmt))
        assert "git_push" not in schema_text and "wiper" not in schema_text and "reader" in schema_text
    outcome = async_to_sync(service.execute)("git_push", {})
    assert (outcome.status, outcome.decision.rule) == ("denied", "channel:ops:git*")
    # The same tool in another channel is visible again.
    assert service_for(cast, channel="lab").describe("git_push") is not None


@pytest.mark.django_db
def test_unattended_ask_is_denied_at_once_without_asking(cast):
    gate = ApprovingGate()
    service = service_for(cast, channel="nightly", gate=gate)
    outcome = async_to_sync(service.execute)("writer", {})
    assert outcome.status == "denied"
    assert (outcome.decision.verdict, outcome.decision.decided_by, outcome.decision.rule) == (
        "ask",
        "unattended",
        "tier:ask",
    )
    assert "unattended" in outcome.decision.reason
    assert gate.asked == []
    # A call that the policy allows still runs unattended.
    assert async_to_sync(service.execute)("reader", {}).status == "succeeded"


@pytest.mark.django_db
def test_sub_agent_is_bound_by_its_parents_entries(cast):
    child = Agent.objects.create(name="builder-child", parent=cast.builder.agent, token_hash="x" * 64)
    ToolPermission.objects.create(scope="agent", agent=cast.builder.agent, pattern="writer", action="deny")
    ToolPermission.objects.create(scope="agent", agent=child, pattern="writer", action="allow")
    policy = current_policy()
    rule = policy.entry_for("writer", child.id, cast.ops.id)
    assert (rule.action, rule.label) == ("deny", "agent:builder:writer")


@pytest.mark.django_db
def test_a_saved_change_takes_effect_on_the_next_call(cast):
    service = service_for(cast)
    assert service.explain("writer", {})[0].verdict == "ask"
    ToolPermission.objects.create(scope="global", pattern="writer", action="allow")
    assert service_for(cast).explain("writer", {})[0].rule == "global:writer"


def test_scope_table_semantics_without_a_database():
    table = ScopeTable("global:", [("a*", "allow"), ("*z", "ask"), ("*m*", "deny"), ("abc", "allow")])
    assert table.match("abc").label == "global:abc"
    assert table.match("amz").action == "deny"
    assert table.match("axz").action == "ask"
    assert table.match("ax").action == "allow"
    assert table.match("q") is None


class BrokenGate:
    async def standing_grant(self, pending):
        return None

    async def request(self, pending):
        raise RuntimeError("database went away")


@pytest.mark.django_db
def test_a_failing_approval_desk_refuses_the_call(cast):
    outcome = async_to_sync(service_for(cast, gate=BrokenGate()).execute)("writer", {})
    assert (outcome.status, outcome.decision.verdict, outcome.decision.decided_by) == ("denied", "ask", "floor")
    assert "approval desk failed" in outcome.decision.reason
    assert ToolCall.objects.get(id=outcome.id).status == "denied"
