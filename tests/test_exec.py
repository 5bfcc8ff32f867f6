"""bash_exec and code_exec through the chokepoint: the floor before any approval, the sandbox behind, the API on top."""

import gc

import pytest
from asgiref.sync import SyncToAsync, async_to_sync
from django.db import connections

from tests.conftest import client_for
from tests.test_command_policy import CORPUS_ROWS
from tools_app.builtin.exec import BashExec, CodeExec
from tools_app.builtin.files import FileOps
from tools_app.chokepoint.base import ToolContext
from tools_app.chokepoint.registry import ToolRegistry
from tools_app.chokepoint.service import NoApprovalGate, Settlement
from tools_app.command_policy import CommandPolicy
from tools_app.gateway import Gateway, build_request_tool_service, gateway
from tools_app.models import Agent, CommandRule, PolicyState, Scope, ToolCall, ToolPermission
from tools_app.policy_store import current_policy
from tools_app.sandbox import ExecResult, SandboxRefused

CALLS = "/api/v1/calls/"
BLOCKED = [command for verdict, command in CORPUS_ROWS if verdict == "B"]
PASSING = [command for verdict, command in CORPUS_ROWS if verdict == "P"]


class RecordingSandbox:
    """Stands in for the sandbox where a test must prove a command never got as far as running."""

    level = "recording"
    degraded = False

    def __init__(self):
        self.ran: list[str] = []

    def languages(self):
        return ("bash", "python3")

    def workspace(self, *, agent_id, agent_name):
        raise AssertionError("no workspace is needed here")

    async def run(self, request):
        self.ran.append(request.source)
        return ExecResult(0, "", "", False, False, 0, 0, False, 1, self.level, False)


class ApproveEverything:
    def __init__(self):
        self.asked: list[str] = []

    async def standing_grant(self, pending):
        return None

    async def request(self, pending):
        self.asked.append(pending.input.get("command", ""))
        return Settlement(approved=True, decided_by="operator", reason="approved in the test", principal="olive")


@pytest.fixture
def recorded(monkeypatch):
    """The chokepoint with bash_exec on a recording sandbox, the command-policy floor, and a desk that says yes."""
    sandbox = RecordingSandbox()
    registry = ToolRegistry()
    registry.register_all([BashExec(sandbox=sandbox), CodeExec(sandbox=sandbox)])
    wired = Gateway(registry=registry.freeze(), gate=ApproveEverything(), floors=(CommandPolicy(),))
    monkeypatch.setattr("tools_app.gateway.gateway", lambda: wired)
    return sandbox


def set_tier(value: str) -> None:
    PolicyState.objects.update_or_create(pk=1, defaults={"exec_tier": value})
    PolicyState.objects.filter(pk=1).update(version=f"tier-{value}-{ToolPermission.objects.count()}")


def service(cast, channel="ops"):
    return build_request_tool_service(policy=current_policy(), agent_id=cast.builder.agent.id, channel_name=channel)


# -- the facts and the result -----------------------------------------------------------------------------------------


def test_exec_tools_are_destructive_and_not_idempotent():
    for tool in (BashExec(sandbox=None), CodeExec(sandbox=None)):
        assert tool.facts.idempotent is False and tool.facts.requires_approval is True


def test_without_a_sandbox_exec_tools_refuse_and_never_run_unscoped():
    ctx = ToolContext("c1", 1, "builder", "ops", None, True)
    tool = BashExec()
    result = async_to_sync(tool.run)(tool.parse({"command": "echo hi"}), ctx)
    assert (result.success, result.error.code, result.error.message) == (
        False,
        "not_configured",
        "sandbox not configured",
    )


def test_a_failed_command_keeps_its_output():
    class Fails(RecordingSandbox):
        async def run(self, request):
            return ExecResult(2, "partial", "boom", False, False, 7, 4, False, 3, "landlock", True)

    tool = BashExec(sandbox=Fails())
    result = async_to_sync(tool.run)(tool.parse({"command": "false"}), ToolContext("c", 1, "b", "ops", None, True))
    assert result.success is False and result.error.code == "exit_status"
    assert result.output["stdout"] == "partial" and result.output["layer"] == "landlock" and result.output["degraded"]


def test_a_refusal_inside_the_sandbox_names_its_rule():
    class Refuses(RecordingSandbox):
        async def run(self, request):
            raise SandboxRefused("command_blocked", "no", rule="command_policy:rm_critical")

    tool = BashExec(sandbox=Refuses())
    result = async_to_sync(tool.run)(tool.parse({"command": "x"}), ToolContext("c", 1, "b", "ops", None, True))
    assert result.error.code == "command_blocked" and result.error.detail == {"rule": "command_policy:rm_critical"}


# -- the corpus through the chokepoint: the floor decides before any tier, entry or approval -------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("tier", ["ask", "auto", "full"])
@pytest.mark.parametrize("allow_entry", [False, True], ids=["no-entry", "allow-entry"])
def test_every_blocked_corpus_line_is_denied_by_the_floor(cast, recorded, tier, allow_entry):
    if allow_entry:
        ToolPermission.objects.create(scope=Scope.GLOBAL, pattern="bash_exec", action="allow")
    set_tier(tier)
    scoped = service(cast)
    for command in BLOCKED:
        explained, _ = scoped.explain("bash_exec", {"command": command})
        outcome = async_to_sync(scoped.execute)("bash_exec", {"command": command})
        for decision in (explained, outcome.decision):
            assert (decision.verdict, decision.decided_by) == ("deny", "floor"), (command, decision)
            assert decision.rule.startswith("command_policy:"), (command, decision)
        assert outcome.status == "denied" and outcome.result is None
    assert recorded.ran == [], "a blocked command reached the sandbox"
    assert ToolCall.objects.filter(status="denied", decided_by="floor").count() == len(BLOCKED)


@pytest.mark.django_db
@pytest.mark.parametrize("allow_entry", [False, True], ids=["no-entry", "allow-entry"])
def test_every_passing_corpus_line_gets_past_the_floor(cast, recorded, allow_entry):
    if allow_entry:
        ToolPermission.objects.create(scope=Scope.GLOBAL, pattern="bash_exec", action="allow")
    set_tier("full")
    scoped = service(cast)
    for command in PASSING:
        outcome = async_to_sync(scoped.execute)("bash_exec", {"command": command})
        assert outcome.status == "succeeded", (command, outcome.decision)
        assert outcome.decision.decided_by == ("entry" if allow_entry else "tier")
    assert recorded.ran == PASSING


@pytest.mark.django_db
def test_the_floor_decides_before_anyone_is_asked(cast, recorded):
    set_tier("ask")
    scoped = service(cast)
    assert async_to_sync(scoped.execute)("bash_exec", {"command": "rm -rf /"}).decision.decided_by == "floor"
    assert scoped.gate.asked == []
    assert async_to_sync(scoped.execute)("bash_exec", {"command": "ls"}).decision.decided_by == "operator"
    assert scoped.gate.asked == ["ls"] and recorded.ran == ["ls"]


@pytest.mark.django_db
def test_code_exec_in_bash_meets_the_floor_too(cast, recorded):
    set_tier("full")
    outcome = async_to_sync(service(cast).execute)("code_exec", {"language": "bash", "code": "sudo rm -rf /"})
    assert outcome.decision.rule == "command_policy:rm_critical" and recorded.ran == []


# -- through the API, with the gateway as wired -----------------------------------------------------------------------


@pytest.fixture
def as_builder_full(cast):
    Agent.objects.filter(pk=cast.builder.agent.pk).update(exec_tier="full")
    return client_for(cast.builder.token)


@pytest.mark.django_db
def test_bash_exec_echo_hi_under_full_returns_hi_and_its_layer(cast, as_builder_full):
    health = gateway().health["sandbox"]
    if health["status"] in ("refused", "unavailable"):
        pytest.skip(f"no sandbox layer runs here: {health['reasons']}")
    response = as_builder_full.post(
        CALLS, {"tool": "bash_exec", "input": {"command": "echo hi"}, "channel": "ops"}, format="json"
    )
    assert response.status_code == 200, response.content
    call = response.json()
    assert call["status"] == "succeeded", call
    assert call["decision"]["rule"] == "tier:full"
    output = call["result"]["output"]
    assert output["stdout"] == "hi\n" and output["exit_code"] == 0
    assert output["layer"] == health["level"] and output["degraded"] == health["degraded"]


@pytest.mark.django_db
def test_the_floor_refuses_through_the_api_with_its_rule(cast, as_builder_full):
    ToolPermission.objects.create(scope=Scope.AGENT, agent=cast.builder.agent, pattern="bash_exec", action="allow")
    response = as_builder_full.post(
        CALLS, {"tool": "bash_exec", "input": {"command": "sudo rm -rf /"}, "channel": "ops"}, format="json"
    )
    call = response.json()
    assert response.status_code == 200 and call["status"] == "denied"
    assert (call["decision"]["decided_by"], call["decision"]["rule"]) == ("floor", "command_policy:rm_critical")


@pytest.mark.django_db
def test_an_admin_rule_refuses_through_the_api_and_the_sandbox_repeats_it(cast, as_builder_full):
    CommandRule.objects.create(name="no_publish", regex=r"npm\s+publish", action="block", reason="For people.")
    response = as_builder_full.post(
        CALLS, {"tool": "bash_exec", "input": {"command": "cd pkg && npm publish"}, "channel": "ops"}, format="json"
    )
    call = response.json()
    assert response.status_code == 200 and call["status"] == "denied"
    assert (call["decision"]["decided_by"], call["decision"]["rule"]) == ("floor", "command_policy:no_publish")
    assert "For people." in call["decision"]["reason"]
    # The sandbox's own check, which a tool reaching it some other way would meet, has the rule too.
    sandbox_floor = gateway().floors[0]
    assert sandbox_floor.evaluate(language="bash", text="npm publish").blocked.name == "no_publish"


@pytest.fixture
def worker_connections_closed():
    """The desk reads the database from worker threads; close their connections so PostgreSQL can drop the DB."""
    yield
    SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=10)
    gc.collect()


@pytest.mark.django_db(transaction=True)
def test_file_ops_delete_under_auto_parks_for_approval(cast, worker_connections_closed):
    Agent.objects.filter(pk=cast.builder.agent.pk).update(exec_tier="auto")
    client = client_for(cast.builder.token)
    written = client.post(
        CALLS,
        {"tool": "file_ops", "input": {"operation": "write", "path": "doomed.txt", "content": "x"}, "channel": "ops"},
        format="json",
    ).json()
    assert written["status"] == "succeeded", written
    response = client.post(
        CALLS,
        {"tool": "file_ops", "input": {"operation": "delete", "path": "doomed.txt"}, "channel": "ops", "wait": 0.5},
        format="json",
    )
    call = response.json()
    assert (call["decision"]["verdict"], call["decision"]["rule"]) == ("ask", "tier:auto"), call
    assert call["result"] is None
    if isinstance(gateway().gate, NoApprovalGate):
        # No desk wired: the ask is refused at once and says so.
        assert response.status_code == 200 and call["status"] == "denied"
        assert "approval" in call["decision"]["reason"].lower()
    else:
        # The desk is wired: the call waits for a person.
        assert response.status_code == 202 and call["status"] == "pending_approval", call
    workspace = (
        gateway()
        .registry.get("file_ops")
        .dependencies["sandbox"]
        .workspace(agent_id=cast.builder.agent.id, agent_name="builder")
    )
    assert (workspace.path / "doomed.txt").exists()


@pytest.mark.django_db
def test_file_ops_delete_parks_with_a_desk_that_waits(cast, monkeypatch):
    """The same call with a desk whose person has not answered yet: 202 and pending_approval."""

    class Waiting:
        async def standing_grant(self, pending):
            return None

        async def request(self, pending):
            import asyncio

            await asyncio.sleep(5)
            return Settlement(approved=False, decided_by="timeout", reason="nobody answered", expired=True)

    wired = gateway()
    monkeypatch.setattr(
        "tools_app.gateway.gateway",
        lambda: Gateway(registry=wired.registry, gate=Waiting(), floors=wired.floors, health=wired.health),
    )
    Agent.objects.filter(pk=cast.builder.agent.pk).update(exec_tier="auto")
    response = client_for(cast.builder.token).post(
        CALLS,
        {"tool": "file_ops", "input": {"operation": "delete", "path": "x.txt"}, "channel": "ops", "wait": 0.2},
        format="json",
    )
    assert response.status_code == 202, response.content
    assert response.json()["status"] == "pending_approval"
    assert response.json()["decision"]["verdict"] == "ask"


@pytest.mark.django_db
def test_the_same_delete_from_an_unattended_channel_is_refused_at_once(cast):
    Agent.objects.filter(pk=cast.builder.agent.pk).update(exec_tier="auto")
    response = client_for(cast.builder.token).post(
        CALLS,
        {"tool": "file_ops", "input": {"operation": "delete", "path": "doomed.txt"}, "channel": "nightly", "wait": 30},
        format="json",
    )
    call = response.json()
    assert response.status_code == 200 and call["status"] == "denied"
    assert (call["decision"]["verdict"], call["decision"]["decided_by"]) == ("ask", "unattended")
    assert "nightly" in call["decision"]["reason"]


@pytest.mark.django_db
def test_file_ops_reads_run_under_ask_without_asking(cast):
    set_tier("ask")
    response = client_for(cast.builder.token).post(
        CALLS, {"tool": "file_ops", "input": {"operation": "list"}, "channel": "nightly"}, format="json"
    )
    call = response.json()
    assert call["status"] == "succeeded" and call["decision"]["rule"] == "tier:ask", call


def test_file_ops_facts_follow_the_operation():
    tool = FileOps(sandbox=None)
    for operation, facts in (
        ("read", (True, False)),
        ("list", (True, False)),
        ("stat", (True, False)),
        ("search", (True, False)),
        ("write", (False, False)),
        ("append", (False, False)),
        ("mkdir", (False, False)),
        ("copy", (False, False)),
        ("delete", (False, True)),
        ("move", (False, True)),
    ):
        raw = {"operation": operation, "path": "a", "content": "x", "destination": "b", "query": "q"}
        got = tool.facts_for(tool.parse(raw))
        assert (got.idempotent, got.requires_approval) == facts, operation


@pytest.mark.django_db
def test_health_reports_the_sandbox(cast):
    sandbox = client_for(cast.builder.token).get("/api/v1/health/").json()["sandbox"]
    assert sandbox == gateway().health["sandbox"]
    assert sandbox["level"] in ("none", "rlimits", "landlock", "bubblewrap")
    assert {"level", "degraded", "status", "reasons", "layers"} <= set(sandbox)
