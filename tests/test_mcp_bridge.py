"""The bridge against real MCP servers: names, a real call each through the chokepoint, gated tools, tiers, timeouts."""

import time

import pytest
from asgiref.sync import sync_to_async

from tests.conftest import make_cast
from tests.mcp_support import (
    HttpPeer,
    bridge_open,
    db_release,
    eventually,
    everything_row,
    peer_row,
    raw_row,
    server_add,
    time_row,
)
from tools_app.chokepoint.service import CallRejected
from tools_app.models import McpServer, PolicyState, Scope, ToolCall, ToolPermission

RESOURCE_TOOLS = {"mcp_list_resources", "mcp_list_resource_templates", "mcp_read_resource"}
PROMPT_TOOLS = {"mcp_list_prompts", "mcp_get_prompt"}


@pytest.fixture
def mcp_cast(transactional_db):
    return make_cast()


@pytest.fixture
async def bridge(mcp_cast):
    opened = await bridge_open()
    yield opened
    await opened.manager.stop()
    await db_release()


@pytest.fixture
def http_peer():
    peer = HttpPeer()
    yield peer
    peer.stop()


def _connected(bridge, *names):
    return lambda: all(bridge.status(name) == "connected" for name in names)


async def test_real_peers_appear_under_their_names_and_answer_through_the_chokepoint(bridge, mcp_cast, http_peer):
    await server_add(**everything_row())
    await server_add(**time_row())
    await server_add(**peer_row())
    await server_add(name="web", transport="http", url=http_peer.url, network_allow=["127.0.0.1"])
    await eventually(_connected(bridge, "everything", "time", "peer", "web"), what="four servers connected")

    service = await bridge.service(agent_id=mcp_cast.builder.agent.id)
    names = {definition.name for definition in service.list()}
    assert {"everything__echo", "everything__get-sum", "everything__get-tiny-image"} <= names
    assert {"time__get_current_time", "time__convert_time"} <= names
    assert {"peer__add", "peer__echo", "peer__delete_item", "peer__mystery"} <= names  # "peer:echo" lost its prefix
    assert {"web__add", "web__peer_echo"} <= names  # another server's prefix is kept, mapped
    assert {"note_write", "note_search"} <= names  # the builtins are still there
    assert {n.split("__")[0] for n in names if "__" in n} == {"everything", "time", "peer", "web"}

    calls = {
        "everything__echo": {"message": "hello from Aleph"},
        "time__get_current_time": {"timezone": "UTC"},
        "peer__add": {"a": 2, "b": 3},
        "web__add": {"a": 40, "b": 2},
    }
    outcomes = {name: await service.execute(name, arguments) for name, arguments in calls.items()}
    for name, outcome in outcomes.items():
        assert outcome.status == "succeeded", (name, outcome.as_dict())
        assert outcome.decision.verdict == "allow"
        assert outcome.decision.rule == "tier:ask"  # read-only MCP tools run under the Ask tier
    assert outcomes["everything__echo"].result.output["content"][0]["text"] == "Echo: hello from Aleph"
    assert outcomes["time__get_current_time"].result.output["structuredContent"]["timezone"] == "UTC"
    assert outcomes["peer__add"].result.output["structuredContent"] == {"result": 5}
    assert outcomes["web__add"].result.output["structuredContent"] == {"result": 42}
    recorded = await sync_to_async(lambda: set(ToolCall.objects.values_list("tool", flat=True)))()
    assert set(calls) <= recorded  # every call is in the event log

    stored = await McpServer.objects.aget(name="everything")
    assert stored.status == "connected" and stored.connected_since is not None
    assert {"tools", "resources", "prompts"} <= set(stored.capabilities)
    health = {row["name"]: row for row in bridge.manager.health["mcp_servers"]}
    assert health["web"]["status"] == "connected" and health["web"]["tools"] >= 7


async def test_resource_and_prompt_tools_exist_exactly_while_everything_is_connected(bridge, mcp_cast):
    await server_add(**raw_row())  # tools only: it advertises neither resources nor prompts
    await eventually(_connected(bridge, "raw"), what="raw connected")
    service = await bridge.service(agent_id=mcp_cast.builder.agent.id)
    assert not (RESOURCE_TOOLS | PROMPT_TOOLS) & {d.name for d in service.list()}

    everything = await server_add(**everything_row())
    await eventually(_connected(bridge, "everything"), what="everything connected")
    service = await bridge.service(agent_id=mcp_cast.builder.agent.id)
    assert (RESOURCE_TOOLS | PROMPT_TOOLS) <= {d.name for d in service.list()}

    listed = await service.execute("mcp_list_resources", {})
    ids = [r["id"] for r in listed.result.output["resources"]]
    assert "everything:demo://resource/static/document/architecture.md" in ids
    read = await service.execute(
        "mcp_read_resource", {"id": "everything:demo://resource/static/document/architecture.md"}
    )
    assert read.status == "succeeded" and read.decision.verdict == "allow"
    assert "Architecture" in read.result.output["contents"][0]["text"]
    templates = await service.execute("mcp_list_resource_templates", {"server": "everything"})
    assert "everything:demo://resource/dynamic/text/{resourceId}" in [
        t["id"] for t in templates.result.output["resource_templates"]
    ]
    prompts = await service.execute("mcp_list_prompts", {})
    assert "everything:args-prompt" in [p["id"] for p in prompts.result.output["prompts"]]
    prompt = await service.execute("mcp_get_prompt", {"id": "everything:args-prompt", "arguments": {"city": "Paris"}})
    assert "Paris" in prompt.result.output["messages"][0]["content"]["text"]
    missing = await service.execute("mcp_read_resource", {"id": "nowhere:demo://x"})
    assert missing.status == "failed" and missing.result.error.code == "mcp_unavailable"

    everything.enabled = False
    await everything.asave()
    await eventually(lambda: bridge.registry.get("everything__echo") is None, what="everything's tools gone")
    service = await bridge.service(agent_id=mcp_cast.builder.agent.id)
    names = {d.name for d in service.list()}
    assert not (RESOURCE_TOOLS | PROMPT_TOOLS) & names
    assert "raw__ok_tool" in names  # the other server is untouched
    with pytest.raises(CallRejected) as rejected:
        await service.execute("mcp_read_resource", {"id": "everything:demo://x"})
    assert rejected.value.code == "tool_not_found"
    await eventually(
        lambda: McpServer.objects.filter(name="everything", status="disabled").aexists(), what="stored as disabled"
    )


async def test_a_real_peer_with_a_bad_schema_and_clashing_names(bridge, mcp_cast):
    await server_add(**raw_row())
    await eventually(_connected(bridge, "raw"), what="raw connected")
    catalog = bridge.manager.catalog
    assert [(q.server, q.tool) for q in catalog.quarantined] == [("raw", "bad_schema")]
    assert "type 'array'" in catalog.quarantined[0].reason
    assert [(c.name, c.tool, c.taken_by) for c in catalog.collisions] == [("raw__a_b", "a_b", "raw:a.b")]
    service = await bridge.service(agent_id=mcp_cast.builder.agent.id)
    names = {d.name for d in service.list()}
    assert "raw__bad_schema" not in names and {"raw__ok_tool", "raw__a_b"} <= names
    # Unannotated: unknown facts, so even a harmless call asks (and with no desk wired, is refused as an ask).
    outcome = await service.execute("raw__ok_tool", {"x": "y"})
    assert (outcome.decision.verdict, outcome.decision.rule, outcome.status) == ("ask", "tier:ask", "denied")
    await sync_to_async(ToolPermission.objects.create)(scope=Scope.GLOBAL, pattern="raw__*", action="allow")
    service = await bridge.service(agent_id=mcp_cast.builder.agent.id)
    outcome = await service.execute("raw__ok_tool", {"x": "y"})
    assert outcome.status == "succeeded"
    assert '"arguments": {"x": "y"}' in outcome.result.output["content"][0]["text"]
    with pytest.raises(CallRejected) as rejected:
        await service.execute("raw__ok_tool", {"x": 1})  # the server's schema validates the call before it leaves
    assert rejected.value.code == "invalid_arguments"


async def _set_tier(tier: str) -> None:
    def store():
        state, _ = PolicyState.objects.get_or_create(pk=1)
        state.exec_tier = tier
        state.save()

    await sync_to_async(store)()


TIER_TABLE = {
    # tool: verdict under (ask, auto, full)
    "peer__add": ("allow", "allow", "allow"),  # readOnlyHint: read-only
    "peer__set_flag": ("allow", "allow", "allow"),  # idempotent, not destructive
    "peer__delete_item": ("ask", "ask", "allow"),  # destructiveHint
    "peer__mystery": ("ask", "ask", "ask"),  # no annotations: unknown facts
}
ARGUMENTS = {
    "peer__add": {"a": 1, "b": 1},
    "peer__set_flag": {"flag": "on"},
    "peer__delete_item": {"item": "x"},
    "peer__mystery": {"x": "y"},
}


async def test_annotations_become_facts_and_the_tier_reads_them(bridge, mcp_cast):
    await server_add(**peer_row())
    await eventually(_connected(bridge, "peer"), what="peer connected")
    for column, tier in enumerate(("ask", "auto", "full")):
        await _set_tier(tier)
        service = await bridge.service(agent_id=mcp_cast.builder.agent.id)
        for name, verdicts in TIER_TABLE.items():
            outcome = await service.execute(name, ARGUMENTS[name])
            assert outcome.decision.verdict == verdicts[column], (tier, name, outcome.as_dict())
            assert outcome.decision.rule == f"tier:{tier}"
            assert outcome.status == ("succeeded" if verdicts[column] == "allow" else "denied")
    # Unknown facts ask even under Full, until an admin writes an entry for the tool.
    await sync_to_async(ToolPermission.objects.create)(scope=Scope.GLOBAL, pattern="peer__mystery", action="allow")
    service = await bridge.service(agent_id=mcp_cast.builder.agent.id)
    outcome = await service.execute("peer__mystery", {"x": "now"})
    assert (outcome.decision.verdict, outcome.decision.decided_by, outcome.status) == ("allow", "entry", "succeeded")
    assert outcome.result.output["structuredContent"] == {"result": "mystery now"}
    await sync_to_async(ToolPermission.objects.create)(
        scope=Scope.CHANNEL, channel=mcp_cast.ops, pattern="peer__*", action="deny"
    )
    service = await bridge.service(agent_id=mcp_cast.builder.agent.id)
    assert not [d.name for d in service.list() if d.name.startswith("peer__")]  # deny hides
    denied = await service.execute("peer__add", {"a": 1, "b": 2})
    assert (denied.status, denied.decision.rule) == ("denied", "channel:ops:peer__*")


async def test_a_call_that_outlives_its_timeout_is_cancelled_on_the_server(bridge, mcp_cast, tmp_path):
    events = tmp_path / "events"
    await server_add(**peer_row(PEER_EVENTS_FILE=str(events)), call_timeout_s=1)
    await eventually(_connected(bridge, "peer"), what="peer connected")
    service = await bridge.service(agent_id=mcp_cast.builder.agent.id)
    started = time.monotonic()
    outcome = await service.execute("peer__slow", {"seconds": 30})
    assert time.monotonic() - started < 5
    assert outcome.status == "failed" and outcome.result.error.code == "timeout"
    await eventually(lambda: events.exists() and "cancelled" in events.read_text(), what="the peer saw the cancel")
    again = await service.execute("peer__add", {"a": 1, "b": 1})
    assert again.status == "succeeded"  # the session survived the cancelled call


async def test_an_http_server_on_a_private_address_needs_an_admin_approved_entry(bridge, mcp_cast, http_peer):
    server = await server_add(name="web", transport="http", url=http_peer.url)
    await eventually(lambda: bridge.status("web") == "error", what="web refused")
    assert "loopback" in bridge.row("web")["last_error"]
    assert not [t for t in bridge.manager.all() if t.name.startswith("web__")]
    server.network_allow = ["127.0.0.1"]
    await server.asave()
    await eventually(_connected(bridge, "web"), what="web connected once allowed")
    assert bridge.registry.get("web__add") is not None
