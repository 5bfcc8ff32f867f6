"""Management commands: agent create, user create, policy import/export and seed_demo, as API.md describes them."""

import base64
import json
import stat
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from tests.conftest import client_for
from tools_app.models import Agent, Channel, PolicyState, ToolCall, ToolPermission


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_agent_create_json_prints_name_token_and_key_and_the_token_works(cast):
    payload = json.loads(run("agent", "create", "courier", "--tier", "auto", "--parent", "builder", "--json"))
    assert set(payload) == {"name", "token", "public_key"}
    assert payload["name"] == "courier"
    assert payload["public_key"] is None or len(base64.b64decode(payload["public_key"])) == 32
    agent = Agent.objects.get(name="courier")
    assert (agent.exec_tier, agent.parent.name) == ("auto", "builder")
    assert payload["token"] not in agent.token_hash
    response = client_for(payload["token"]).post(
        "/api/v1/calls/", {"tool": "note_search", "input": {"query": "x"}, "channel": "ops"}, format="json"
    )
    assert response.status_code == 200, response.content
    assert ToolCall.objects.get().agent == agent


def test_agent_create_without_json_prints_the_token_once(cast):
    text = run("agent", "create", "plain")
    token = text.strip().splitlines()[-1]
    assert token.startswith("aleph_agent_")
    assert client_for(token).get("/api/v1/tools/", {"channel": "ops"}).status_code == 200


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("agent", "create", "builder"), "already exists"),
        (("agent", "create", "fresh", "--parent", "ghost"), "ghost"),
        (("agent", "create", "no spaces"), "letters, digits"),
        (("agent", "create", "fresh", "--tier", "turbo"), "turbo"),
        (("user", "create", "olive", "--role", "operator"), "already exists"),
        (("user", "create", "fresh", "--role", "overlord"), "overlord"),
        (("user", "create", "fresh"), "--role"),
    ],
)
def test_bad_or_duplicate_names_fail_with_a_clear_command_error(cast, args, says):
    agents, users = Agent.objects.count(), get_user_model().objects.count()
    with pytest.raises(CommandError) as raised:
        run(*args)
    assert says in str(raised.value)
    assert (Agent.objects.count(), get_user_model().objects.count()) == (agents, users)


def test_user_create_json_and_the_token_and_password_work(cast):
    payload = json.loads(run("user", "create", "opal", "--role", "operator", "--password", "opal-pass-123", "--json"))
    assert set(payload) == {"name", "token"}
    assert payload["name"] == "opal"
    user = get_user_model().objects.get(username="opal")
    assert list(user.groups.values_list("name", flat=True)) == ["operator"]
    assert not user.is_staff and not user.is_superuser
    cast.ops.operators.add(user)
    person = client_for(payload["token"])
    body = {"agent": "builder", "channel": "ops", "tool": "note_write", "input": {"text": "x"}}
    assert person.post("/api/v1/policy/explain/", body, format="json").status_code == 200
    assert person.post("/api/v1/calls/", {**body, "agent": None}, format="json").status_code in (400, 403)
    assert Client().login(username="opal", password="opal-pass-123")


def test_user_create_admin_is_a_superuser(cast):
    payload = json.loads(run("user", "create", "root2", "--role", "admin", "--json"))
    user = get_user_model().objects.get(username=payload["name"])
    assert user.is_superuser and user.is_staff
    assert not user.has_usable_password()


def test_policy_export_and_import_through_the_command(cast, tmp_path):
    run("agent", "create", "courier", "--tier", "full")
    exported = run("policy", "export")
    assert 'name = "courier"' in exported
    edited = exported.replace('[policies]\nexec_tier = "ask"', '[policies]\nexec_tier = "auto"')
    edited += '\n[[agents]]\nname = "fresh"\n[agents.tool_permissions]\n"note_write" = "deny"\n'
    path = tmp_path / "aleph.toml"
    path.write_text(edited)
    text = run("policy", "import", str(path))
    assert "1 permission entries (0 removed)" in text
    assert "New agent fresh" in text
    token = text.strip().splitlines()[-1].rsplit(" ", 1)[-1]
    listed = client_for(token).get("/api/v1/tools/", {"channel": "ops"}).json()
    assert "note_write" not in {tool["name"] for tool in listed}
    assert PolicyState.objects.get().exec_tier == "auto"
    again = run("policy", "export")
    path.write_text(again)
    run("policy", "import", str(path))
    assert run("policy", "export") == again


def test_policy_import_of_a_missing_file_is_a_command_error(cast, tmp_path):
    with pytest.raises(CommandError, match="cannot read"):
        run("policy", "import", str(tmp_path / "nope.toml"))


def _world() -> dict:
    User = get_user_model()
    return {
        "users": sorted(User.objects.values_list("username", "is_superuser", "password")),
        "agents": sorted(Agent.objects.values_list("name", "exec_tier", "token_hash")),
        "channels": sorted(Channel.objects.values_list("name", "kind", "unattended", "max_tier")),
        "entries": sorted(ToolPermission.objects.values_list("scope", "pattern", "action", "changed_at")),
        "version": PolicyState.objects.get().version,
    }


def test_seed_demo_twice_is_idempotent_and_its_sign_ins_work(db, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    first = run("seed_demo")
    world = _world()
    tokens_file = tmp_path / "demo-tokens.json"
    tokens = json.loads(tokens_file.read_text())
    assert stat.S_IMODE(tokens_file.stat().st_mode) == 0o600
    assert set(tokens) == {"user:admin", "user:alice", "user:audrey", "agent:builder", "agent:scout"}
    assert {n for n, *_ in world["agents"]} == {"builder", "scout"}
    assert {n for n, *_ in world["channels"]} == {"ops", "nightly"}
    assert "admin / aleph-admin" in first
    second = run("seed_demo")
    assert _world() == world
    assert json.loads(tokens_file.read_text()) == tokens
    assert second == first
    for name, password in (("admin", "aleph-admin"), ("alice", "aleph-operator"), ("audrey", "aleph-auditor")):
        assert Client().login(username=name, password=password), name
    response = client_for(tokens["agent:builder"]).post(
        "/api/v1/calls/", {"tool": "note_search", "input": {"query": "x"}, "channel": "ops"}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["decision"]["rule"] == "global:note_search"
    scout_tools = client_for(tokens["agent:scout"]).get("/api/v1/tools/", {"channel": "ops"}).json()
    assert "vault_store" not in {tool["name"] for tool in scout_tools}
