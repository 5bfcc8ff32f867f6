"""The REST API with the fixed cast: who may do what; every refusal a JSON error that leaves no half-written call."""

import json
import uuid

import pytest
from django.db import connection
from rest_framework.test import APIClient

from tests.conftest import client_for
from tools_app.builtin import builtin_tools
from tools_app.chokepoint.registry import ToolRegistry
from tools_app.chokepoint.service import NoApprovalGate, Settlement
from tools_app.crypto import secret_box
from tools_app.gateway import Gateway, gateway
from tools_app.models import Agent, Note, Scope, ToolCall, ToolPermission, VaultSecret

CALLS = "/api/v1/calls/"
EXPLAIN = "/api/v1/policy/explain/"
TOOLS = "/api/v1/tools/"
SCHEMA = "/api/v1/tools/schema/"


def assert_error(response, status: int, code: str | None = None) -> dict:
    """A refusal is JSON `{"error": {"code", "message", "detail"}}` with the status it should have."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = json.loads(response.content)
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error["code"], str) and error["code"], body
    assert isinstance(error["message"], str) and error["message"], body
    assert isinstance(error["detail"], dict), body
    if code is not None:
        assert error["code"] == code, body
    return error


def post_call(client, **body):
    body.setdefault("channel", "ops")
    return client.post(CALLS, body, format="json")


def permit(pattern: str, action: str, *, agent=None, channel=None) -> ToolPermission:
    scope = Scope.AGENT if agent else Scope.CHANNEL if channel else Scope.GLOBAL
    return ToolPermission.objects.create(scope=scope, agent=agent, channel=channel, pattern=pattern, action=action)


def tier(agent: Agent, value: str) -> None:
    agent.exec_tier = value
    agent.save()


class ApproveEverything:
    """An approval desk whose person says yes at once: lets a confirmation-required tool actually run."""

    async def standing_grant(self, pending):
        return None

    async def request(self, pending):
        return Settlement(approved=True, decided_by="operator", reason="approved in the test", principal="olive")


@pytest.fixture
def wire(monkeypatch):
    """Replace the process's gateway with the builtin tools and the approval gate the test names."""

    def install(gate) -> Gateway:
        registry = ToolRegistry()
        registry.register_all(builtin_tools(vault_box=secret_box(b"aleph-vault")))
        wired = Gateway(registry=registry.freeze(), gate=gate)
        monkeypatch.setattr("tools_app.gateway.gateway", lambda: wired)
        return wired

    return install


# -- who may call what -------------------------------------------------------------------------------------------


def test_unauthenticated_requests_get_401_json_with_a_challenge(cast):
    response = APIClient().get(TOOLS, {"channel": "ops"})
    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert_error(client_for("aleph_agent_not-a-real-token").get(TOOLS, {"channel": "ops"}), 401, "not_authenticated")
    response = APIClient().post(
        CALLS, {"tool": "note_search", "input": {"query": "x"}, "channel": "ops"}, format="json"
    )
    assert_error(response, 401, "not_authenticated")
    assert ToolCall.objects.count() == 0


def test_health_is_open_to_anyone(cast):
    response = APIClient().get("/api/v1/health/")
    assert response.status_code == 200
    assert response.json()["database"]["ok"] is True


def test_unknown_api_urls_answer_json_404(cast, as_builder):
    for path in ("/api/v1/nothing-here/", "/api/v2/tools/", "/api/", "/api/v1/calls/not-a-uuid/"):
        assert_error(as_builder.get(path), 404, "not_found")


def test_an_agent_cannot_act_as_another_agent(cast, as_builder):
    scout = cast.scout.agent
    for extra in ({"agent": "scout"}, {"agent_id": scout.id}, {"principal": "olive"}):
        response = post_call(as_builder, tool="note_search", input={"query": "x"}, **extra)
        error = assert_error(response, 400, "invalid_request")
        assert next(iter(extra)) in error["detail"], error
    assert ToolCall.objects.count() == 0
    response = post_call(as_builder, tool="note_search", input={"query": "x"})
    assert response.status_code == 200, response.content
    assert ToolCall.objects.get().agent == cast.builder.agent


def test_sessions_belong_to_the_agent_that_names_them(cast, as_builder, as_scout):
    for client in (as_builder, as_scout):
        assert post_call(client, tool="note_search", input={"query": "x"}, session="s1").status_code == 200
    calls = ToolCall.objects.select_related("session__agent")
    assert {(c.agent.name, c.session.agent.name, c.session.key) for c in calls} == {
        ("builder", "builder", "s1"),
        ("scout", "scout", "s1"),
    }


def test_an_agent_cannot_see_another_agents_calls(cast, as_builder, as_scout):
    response = post_call(as_builder, tool="note_search", input={"query": "x"})
    call_id = response.json()["id"]
    assert as_builder.get(f"{CALLS}{call_id}/", {"wait": 0}).status_code == 200
    assert_error(as_scout.get(f"{CALLS}{call_id}/", {"wait": 0}), 404, "call_not_found")
    assert_error(as_builder.get(f"{CALLS}{uuid.uuid4()}/"), 404, "call_not_found")


def test_get_call_with_wait_zero_returns_the_finished_call(cast, as_builder):
    posted = post_call(as_builder, tool="note_search", input={"query": "x"}).json()
    response = as_builder.get(f"{CALLS}{posted['id']}/", {"wait": 0})
    assert response.status_code == 200
    assert response.json() == posted
    assert posted["status"] == "succeeded"
    assert posted["result"]["success"] is True
    assert_error(as_builder.get(f"{CALLS}{posted['id']}/", {"wait": "soon"}), 400, "invalid_request")
    assert_error(as_builder.get(f"{CALLS}{posted['id']}/", {"wait": 301}), 400, "invalid_request")


def _stored(pk: uuid.UUID) -> tuple:
    """A row exactly as the database holds it, without the ORM's conversions on the way back."""
    table, key = connection.ops.quote_name(ToolCall._meta.db_table), ToolCall._meta.pk
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {table} WHERE {key.column} = %s", [key.get_db_prep_value(pk, connection)])
        return cursor.fetchone()


def test_the_event_log_row_is_the_one_save_would_write(cast, as_builder):
    # The chokepoint writes new rows with a statement it builds once; they must hold what Model.save() would store.
    posted = post_call(as_builder, tool="note_search", input={"query": "ünï ✓", "limit": 3}, session="s-1").json()
    twin = ToolCall.objects.get(id=posted["id"])
    assert twin.session is not None and twin.output == posted["result"]["output"]
    twin.id = uuid.uuid4()
    twin.save(force_insert=True)
    written, saved = _stored(uuid.UUID(posted["id"])), _stored(twin.id)
    assert written[1:] == saved[1:] and written[0] != saved[0]


def test_an_agent_cannot_change_policy_or_explain(cast, as_builder):
    body = {"agent": "builder", "channel": "ops", "tool": "note_write", "input": {"text": "x"}}
    assert_error(as_builder.post(EXPLAIN, body, format="json"), 403, "permission_denied")
    for method in ("put", "patch", "delete"):
        assert_error(getattr(as_builder, method)(f"{TOOLS}note_write/?channel=ops"), 405, "method_not_allowed")
    response = as_builder.get("/admin/tools_app/toolpermission/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert as_builder.post(
        "/admin/tools_app/globaltoolpermission/add/", {"pattern": "*", "action": "allow"}
    ).status_code
    assert not ToolPermission.objects.exists()


def test_people_tokens_cannot_make_calls(cast):
    for person in (cast.admin, cast.operator, cast.auditor, cast.outsider):
        response = post_call(client_for(person.token), tool="note_search", input={"query": "x"})
        assert_error(response, 403, "permission_denied")
        assert_error(client_for(person.token).get(TOOLS, {"channel": "ops"}), 403, "permission_denied")
    assert ToolCall.objects.count() == 0


EXPLAIN_CASES = [
    ("admin", "ops", 200, None),
    ("admin", "lab", 200, None),
    ("operator", "ops", 200, None),
    ("operator", "lab", 404, "channel_not_found"),
    ("other_operator", "lab", 200, None),
    ("other_operator", "ops", 404, "channel_not_found"),
    ("auditor", "ops", 403, "permission_denied"),
    ("outsider", "ops", 403, "permission_denied"),
]


@pytest.mark.parametrize(("who", "channel", "status", "code"), EXPLAIN_CASES)
def test_who_may_explain(cast, who, channel, status, code):
    client = client_for(getattr(cast, who).token)
    body = {"agent": "builder", "channel": channel, "tool": "note_write", "input": {"text": "x"}}
    response = client.post(EXPLAIN, body, format="json")
    if status == 200:
        assert response.status_code == 200, response.content
        decision = response.json()["decision"]
        assert (decision["verdict"], decision["rule"]) == ("ask", "tier:ask")
        assert [step["step"] for step in response.json()["trace"]] == ["entry", "tier", "facts", "floor", "attended"]
    else:
        assert_error(response, status, code)
    assert ToolCall.objects.count() == 0


def test_explain_refuses_unknown_agents_tools_and_fields(cast):
    admin = client_for(cast.admin.token)
    base = {"agent": "builder", "channel": "ops", "tool": "note_write", "input": {"text": "x"}}
    assert_error(admin.post(EXPLAIN, {**base, "agent": "nobody"}, format="json"), 404, "agent_not_found")
    assert_error(admin.post(EXPLAIN, {**base, "tool": "no_such_tool"}, format="json"), 404, "tool_not_found")
    assert_error(admin.post(EXPLAIN, {**base, "channel": "nowhere"}, format="json"), 404, "channel_not_found")
    assert_error(admin.post(EXPLAIN, {**base, "input": {"txt": "x"}}, format="json"), 400, "invalid_arguments")
    assert_error(admin.post(EXPLAIN, {**base, "verdict": "allow"}, format="json"), 400, "invalid_request")
    assert_error(admin.post(EXPLAIN, {"agent": "builder"}, format="json"), 400, "invalid_request")


# -- bad requests never become calls -----------------------------------------------------------------------------

BAD_CALLS = [
    ("unknown tool", {"tool": "no_such_tool", "input": {}}, 404, "tool_not_found"),
    (
        "unknown channel",
        {"tool": "note_search", "input": {"query": "x"}, "channel": "nowhere"},
        404,
        "channel_not_found",
    ),
    ("missing argument", {"tool": "note_search", "input": {}}, 400, "invalid_arguments"),
    ("unknown argument", {"tool": "note_search", "input": {"query": "x", "sql": "drop"}}, 400, "invalid_arguments"),
    ("argument of the wrong type", {"tool": "note_search", "input": {"query": 5}}, 400, "invalid_arguments"),
    (
        "limit of the wrong type",
        {"tool": "note_search", "input": {"query": "x", "limit": "ten"}},
        400,
        "invalid_arguments",
    ),
    ("limit out of range", {"tool": "note_search", "input": {"query": "x", "limit": 0}}, 400, "invalid_arguments"),
    ("input not an object", {"tool": "note_search", "input": ["x"]}, 400, "invalid_request"),
    ("tool not a string", {"tool": ["note_search"], "input": {}}, 400, "invalid_request"),
    ("no tool", {"input": {"query": "x"}}, 400, "invalid_request"),
    ("no channel", {"tool": "note_search", "input": {"query": "x"}, "channel": None}, 400, "invalid_request"),
    ("negative wait", {"tool": "note_search", "input": {"query": "x"}, "wait": -1}, 400, "invalid_request"),
    (
        "session too long",
        {"tool": "note_search", "input": {"query": "x"}, "session": "s" * 101},
        400,
        "invalid_request",
    ),
]


@pytest.mark.parametrize(("case", "body", "status", "code"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_calls_are_json_errors_and_record_nothing(cast, as_builder, case, body, status, code):
    body = {"channel": "ops", **body}
    if body["channel"] is None:
        del body["channel"]
    error = assert_error(as_builder.post(CALLS, body, format="json"), status, code)
    if code == "invalid_arguments":
        assert error["detail"]["errors"], error
    assert ToolCall.objects.count() == 0


def test_bad_json_is_a_400_json_error(cast, as_builder):
    for raw in (b"{not json", b"", b"[1, 2", b"\xff\xfe"):
        response = as_builder.post(CALLS, raw, content_type="application/json")
        assert_error(response, 400)
    assert_error(as_builder.post(CALLS, b"[]", content_type="application/json"), 400, "invalid_request")
    assert_error(as_builder.post(CALLS, b"tool=x", content_type="text/plain"), 415, "unsupported_media_type")
    assert ToolCall.objects.count() == 0


UNSTORABLE = [
    ("unpaired surrogate", '{"tool": "note_search", "input": {"query": "\\ud800x"}, "channel": "ops"}'),
    ("NUL in an argument", '{"tool": "note_write", "input": {"text": "a\\u0000b"}, "channel": "ops"}'),
    ("NUL in a key", '{"tool": "note_search", "input": {"query": "x", "k\\u0000": 1}, "channel": "ops"}'),
    (
        "surrogate in an unknown field",
        '{"tool": "note_search", "input": {"query": "x"}, "channel": "ops", "\\udc00": 1}',
    ),
    ("number out of range", '{"tool": "note_search", "input": {"query": "x", "limit": 1e400}, "channel": "ops"}'),
    ("NaN", '{"tool": "note_search", "input": {"query": "x"}, "channel": "ops", "wait": NaN}'),
    (
        "deep nesting",
        '{"tool": "note_search", "input": {"query": "x", "d": ' + "[" * 50000 + "]" * 50000 + '}, "channel": "ops"}',
    ),
    (
        "nesting over 64",
        '{"tool": "note_search", "input": {"query": "x", "d": ' + "[" * 70 + "]" * 70 + '}, "channel": "ops"}',
    ),
]


@pytest.mark.parametrize(("case", "raw"), UNSTORABLE, ids=[c[0] for c in UNSTORABLE])
def test_json_that_cannot_be_stored_is_refused_before_any_call(cast, as_builder, case, raw):
    permit("note_*", "deny", channel=cast.ops)
    assert_error(as_builder.post(CALLS, raw, content_type="application/json"), 400, "invalid_json")
    assert ToolCall.objects.count() == 0


def test_oversized_input_is_413_and_records_nothing(cast, as_builder, settings):
    text = "x" * (settings.ALEPH_MAX_INPUT_BYTES + 1)
    error = assert_error(post_call(as_builder, tool="note_write", input={"text": text}), 413, "input_too_large")
    assert str(settings.ALEPH_MAX_INPUT_BYTES) in error["message"]
    assert ToolCall.objects.count() == 0


def test_oversized_body_is_413_and_records_nothing(cast, as_builder):
    raw = json.dumps({"tool": "note_write", "input": {"text": "x" * (1024 * 1024 + 10)}, "channel": "ops"})
    assert_error(as_builder.post(CALLS, raw, content_type="application/json"), 413, "request_too_large")
    assert ToolCall.objects.count() == 0


# -- deny, unattended, the confirmation floor --------------------------------------------------------------------


def test_a_denied_call_carries_its_rule_and_is_recorded_once(cast, as_builder):
    permit("note_*", "deny", channel=cast.ops)
    response = post_call(as_builder, tool="note_search", input={"query": "x"})
    assert response.status_code == 200, response.content
    call = response.json()
    assert call["status"] == "denied"
    assert call["result"] is None
    assert call["decision"]["verdict"] == "deny"
    assert call["decision"]["decided_by"] == "entry"
    assert call["decision"]["rule"] == "channel:ops:note_*"
    assert "channel:ops:note_*" in call["decision"]["reason"]
    row = ToolCall.objects.get()
    assert (str(row.id), row.status, row.rule, row.agent_id) == (
        call["id"],
        "denied",
        "channel:ops:note_*",
        cast.builder.agent.id,
    )
    assert (
        post_call(as_builder, tool="note_search", input={"query": "x"}, channel="lab").json()["status"] == "succeeded"
    )


def _names_in_schema(payload: list, format: str) -> set[str]:
    if format == "openai":
        return {entry["function"]["name"] for entry in payload}
    return {entry["name"] for entry in payload}


def test_deny_hides_the_tool_from_list_describe_and_every_schema_format(cast, as_builder, as_scout):
    permit("vault_store", "deny", agent=cast.builder.agent)
    everything = {tool.name for tool in gateway().registry.all()}
    assert {"note_search", "note_write", "vault_store"} <= everything
    visible = everything - {"vault_store"}
    assert {tool["name"] for tool in as_builder.get(TOOLS, {"channel": "ops"}).json()} == visible
    assert {tool["name"] for tool in as_scout.get(TOOLS, {"channel": "ops"}).json()} == everything
    assert_error(as_builder.get(f"{TOOLS}vault_store/", {"channel": "ops"}), 404, "tool_not_found")
    assert as_builder.get(f"{TOOLS}note_write/", {"channel": "ops"}).json()["name"] == "note_write"
    for format in ("openai", "anthropic", "mcp"):
        response = as_builder.get(SCHEMA, {"channel": "ops", "format": format})
        assert response.status_code == 200, (format, response.content)
        assert _names_in_schema(response.json(), format) == visible
        scouts = as_scout.get(SCHEMA, {"channel": "ops", "format": format}).json()
        assert _names_in_schema(scouts, format) == everything
    assert_error(as_builder.get(SCHEMA, {"channel": "ops", "format": "yaml"}), 400, "invalid_request")
    assert_error(as_builder.get(TOOLS), 400, "invalid_request")
    assert_error(as_builder.get(TOOLS, {"channel": "nowhere"}), 404, "channel_not_found")


def test_tool_definitions_carry_schema_and_facts(cast, as_builder):
    definition = as_builder.get(f"{TOOLS}note_write/", {"channel": "ops"}).json()
    assert definition["input_schema"]["required"] == ["text"]
    assert definition["input_schema"]["properties"]["text"]["description"] == "The note to remember."
    assert definition["facts"] == {"idempotent": False, "requires_approval": False}
    mcp = as_builder.get(SCHEMA, {"channel": "ops", "format": "mcp"}).json()
    search = next(entry for entry in mcp if entry["name"] == "note_search")
    assert search["annotations"]["readOnlyHint"] is True
    assert search["inputSchema"]["required"] == ["query"]


def test_unattended_channel_denies_a_call_that_would_ask_at_once(cast, as_builder):
    response = post_call(as_builder, tool="note_write", input={"text": "at night"}, channel="nightly", wait=30)
    assert response.status_code == 200
    call = response.json()
    assert call["status"] == "denied"
    assert call["decision"]["decided_by"] == "unattended"
    assert call["decision"]["rule"] == "tier:ask"
    assert "nightly" in call["decision"]["reason"]
    assert ToolCall.objects.get().status == "denied"
    assert not Note.objects.exists()


def test_vault_store_under_full_with_an_allow_entry_still_asks_and_is_refused_without_a_desk(cast, as_builder, wire):
    wire(NoApprovalGate())
    tier(cast.builder.agent, "full")
    permit("vault_store", "allow", agent=cast.builder.agent)
    explained = client_for(cast.admin.token).post(
        EXPLAIN,
        {"agent": "builder", "channel": "ops", "tool": "vault_store", "input": {"name": "k", "value": "v"}},
        format="json",
    )
    assert explained.json()["decision"]["verdict"] == "ask"
    assert explained.json()["decision"]["decided_by"] == "floor"
    assert explained.json()["decision"]["rule"] == "confirmation_required:vault_store"
    response = post_call(as_builder, tool="vault_store", input={"name": "deploy_key", "value": "hunter2-secret"})
    assert response.status_code == 200
    call = response.json()
    assert call["status"] == "denied"
    assert call["decision"]["verdict"] == "ask"
    assert call["decision"]["rule"] == "confirmation_required:vault_store"
    assert call["decision"]["decided_by"] == "floor"
    assert "approval" in call["decision"]["reason"].lower()
    assert ToolCall.objects.count() == 1
    assert not VaultSecret.objects.exists()


def test_vault_store_never_returns_the_secret_and_stores_ciphertext(cast, as_builder, wire):
    wire(ApproveEverything())
    secret = "correct-horse-battery-staple"
    response = post_call(as_builder, tool="vault_store", input={"name": "deploy_key", "value": secret})
    assert response.status_code == 200, response.content
    call = response.json()
    assert call["status"] == "succeeded", call
    assert call["decision"]["decided_by"] == "operator"
    assert secret not in response.content.decode()
    assert secret not in as_builder.get(f"{CALLS}{call['id']}/").content.decode()
    stored = VaultSecret.objects.get(agent=cast.builder.agent, name="deploy_key")
    ciphertext = bytes(stored.ciphertext)
    assert secret.encode() not in ciphertext
    assert secret_box(b"aleph-vault").decrypt(ciphertext) == secret.encode()


@pytest.mark.parametrize("gate", [ApproveEverything(), NoApprovalGate()], ids=["approved", "refused"])
def test_vault_store_secret_is_not_kept_in_the_event_log(cast, as_builder, wire, gate):
    wire(gate)
    secret = "correct-horse-battery-staple"
    post_call(as_builder, tool="vault_store", input={"name": "deploy_key", "value": secret})
    row = ToolCall.objects.get()
    assert row.input["name"] == "deploy_key"
    assert secret not in json.dumps([row.input, row.output, row.error, row.reason])


def test_notes_are_found_only_by_the_agent_that_wrote_them(cast, as_builder, as_scout):
    tier(cast.builder.agent, "auto")
    written = post_call(as_builder, tool="note_write", input={"text": "the deploy window is Tuesday 14:00"})
    assert written.status_code == 200
    assert written.json()["status"] == "succeeded", written.json()
    assert written.json()["decision"]["rule"] == "tier:auto"
    found = post_call(as_builder, tool="note_search", input={"query": "deploy tuesday"}).json()
    assert found["status"] == "succeeded"
    assert [m["text"] for m in found["result"]["output"]["matches"]] == ["the deploy window is Tuesday 14:00"]
    assert post_call(as_builder, tool="note_search", input={"query": "friday"}).json()["result"]["output"]["count"] == 0
    theirs = post_call(as_scout, tool="note_search", input={"query": "deploy"}).json()
    assert theirs["status"] == "succeeded"
    assert theirs["result"]["output"] == {"matches": [], "count": 0}


def test_an_ask_without_a_desk_is_refused_and_never_runs(cast, as_builder, wire):
    wire(NoApprovalGate())
    call = post_call(as_builder, tool="note_write", input={"text": "needs a person"}).json()
    assert call["status"] == "denied"
    assert call["decision"]["verdict"] == "ask"
    assert call["result"] is None
    assert not Note.objects.exists()
    assert ToolCall.objects.get().status == "denied"
