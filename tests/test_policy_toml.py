"""aleph.toml: import is all-or-nothing and names the line of what is wrong; export then import changes nothing."""

import re
import tomllib

import pytest
from django.core.management import CommandError, call_command

from tests.shared import shared_path
from tools_app.models import Agent, Channel, PolicyState, Scope, ToolPermission
from tools_app.policy_store import policy_state
from tools_app.policy_toml import SECTIONS, PolicyFileError, Section, policy_export, policy_import
from tools_app.services import user_create

POLICY = """\
[policies]
exec_tier = "ask"

[policies.tool_permissions]
"note_search" = "allow"
"github__*" = "deny"
"vault_*" = { action = "ask", note = "secrets need a person" }

[[agents]]
name = "builder"
exec_tier = "auto"

[agents.tool_permissions]
"note_write" = "allow"

[[agents]]
name = "helper"
parent = "builder"

[agents.tool_permissions]
"note_*" = "ask"

[[channels]]
name = "ops"
kind = "web"
unattended = false
max_tier = "auto"
approval_timeout_s = 90
operators = ["olive"]

[channels.tool_permissions]
"web_fetch" = "deny"
"""

# The example of API.md ("Policy as code"), verbatim.
API_MD_EXAMPLE = """\
[policies]
exec_tier = "ask"                       # ask | auto | full  (global default)

[policies.tool_permissions]             # global entries
"bash_exec" = "ask"
"github__*" = "deny"

[[agents]]
name = "builder"
exec_tier = "auto"
[agents.tool_permissions]
"file_ops" = "allow"

[[channels]]
name = "ops"
kind = "web"                             # web | chat | cron | heartbeat | a2a | api
unattended = false                       # true for cron / heartbeat / a2a
max_tier = "auto"                        # optional cap
approval_timeout_s = 120
operators = ["alice"]                    # usernames allowed to decide this channel's cards
[channels.tool_permissions]
"web_fetch" = "deny"

[[mcp_servers]]
name = "everything"
transport = "stdio"                      # stdio | http
command = "npx"
args = ["-y", "@modelcontextprotocol/server-everything"]
# url = "https://mcp.example.com/mcp"    # for transport = "http"

[network]                                # the outbound guard (web_fetch, MCP over HTTP, browser)
allow = ["10.20.0.0/16", "mcp.internal.example"]   # the only way to reach a non-public address

[sandbox.command_policy]
[[sandbox.command_policy.custom_rules]]
name = "no_aws_secrets"
regex = "AWS_SECRET_ACCESS_KEY"
action = "block"                         # block | warn
"""


def line_of(text: str, fragment: str, occurrence: int = 1) -> int:
    hits = [number for number, line in enumerate(text.splitlines(), start=1) if fragment in line]
    return hits[occurrence - 1]


def snapshot() -> dict:
    """Everything an import may touch, down to each entry's changed_at and the policy version."""
    through = Channel.operators.through
    return {
        "export": policy_export(),
        "state": list(PolicyState.objects.values_list("exec_tier", "version", "updated_at")),
        "entries": sorted(
            ToolPermission.objects.values_list(
                "id", "scope", "agent_id", "channel_id", "pattern", "action", "note", "changed_by_id", "changed_at"
            )
        ),
        "agents": sorted(Agent.objects.values_list("id", "name", "parent_id", "exec_tier", "is_active", "token_hash")),
        "channels": sorted(
            Channel.objects.values_list(
                "id", "name", "kind", "unattended", "exec_tier", "max_tier", "approval_timeout_s"
            )
        ),
        "operators": sorted(through.objects.values_list("channel_id", "user_id")),
    }


@pytest.fixture
def imported(cast):
    policy_state()
    summary = policy_import(text=POLICY)
    assert set(summary["new_agent_tokens"]) == {"helper"}
    return cast


def test_the_file_becomes_the_stored_policy(imported):
    assert policy_state().exec_tier == "ask"
    labels = {(p.rule_label, p.action, p.note) for p in ToolPermission.objects.select_related("agent", "channel")}
    assert labels == {
        ("global:note_search", "allow", ""),
        ("global:github__*", "deny", ""),
        ("global:vault_*", "ask", "secrets need a person"),
        ("agent:builder:note_write", "allow", ""),
        ("agent:helper:note_*", "ask", ""),
        ("channel:ops:web_fetch", "deny", ""),
    }
    helper = Agent.objects.get(name="helper")
    assert helper.parent.name == "builder" and helper.exec_tier is None
    assert Agent.objects.get(name="builder").exec_tier == "auto"
    ops = Channel.objects.get(name="ops")
    assert (ops.kind, ops.unattended, ops.max_tier, ops.approval_timeout_s) == ("web", False, "auto", 90)
    assert [u.username for u in ops.operators.all()] == ["olive"]


BAD_FILES = [
    ("bad agent tier", 'exec_tier = "auto"', 'exec_tier = "turbo"', 'exec_tier = "turbo"', "exec_tier"),
    ("bad global tier", 'exec_tier = "ask"', 'exec_tier = "always"', 'exec_tier = "always"', "exec_tier"),
    ("bad channel cap", 'max_tier = "auto"', 'max_tier = "sometimes"', 'max_tier = "sometimes"', "max_tier"),
    ("unknown action", '"note_write" = "allow"', '"note_write" = "permit"', '"note_write" = "permit"', "note_write"),
    ("unknown action in a table", 'action = "ask"', 'action = "perhaps"', 'action = "perhaps"', "vault_*"),
    ("unknown channel action", '"web_fetch" = "deny"', '"web_fetch" = "block"', '"web_fetch" = "block"', "web_fetch"),
    ("bad pattern", '"github__*"', '"github /*"', '"github /*"', "not a tool name or glob"),
    ("bad TOML syntax", 'name = "ops"', "name = ops", "name = ops", "not valid TOML"),
    ("unterminated string", '"note_search" = "allow"', '"note_search" = "allow', '"note_search" = "allow', "TOML"),
    (
        "unknown section",
        '"web_fetch" = "deny"\n',
        '"web_fetch" = "deny"\n\n[mystery]\nenabled = true\n',
        "[mystery]",
        "unknown section [mystery]",
    ),
    ("unknown operator", 'operators = ["olive"]', 'operators = ["olive", "nobody"]', "operators =", "'nobody'"),
    ("duplicate agent", 'name = "helper"', 'name = "builder"', ("[[agents]]", 2), "'builder' appears twice"),
    ("unknown channel key", "approval_timeout_s = 90", 'approval_timeout_s = 90\ncolour = "red"', "colour", "colour"),
    ("bad timeout type", "approval_timeout_s = 90", 'approval_timeout_s = "soon"', "approval_timeout_s", "integer"),
    ("timeout out of range", "approval_timeout_s = 90", "approval_timeout_s = 0", "approval_timeout_s", "timeout"),
    ("bad channel kind", 'kind = "web"', 'kind = "pigeon"', 'kind = "pigeon"', "kind"),
    ("bad agent name", 'name = "helper"', 'name = "no spaces"', 'name = "no spaces"', "name"),
    (
        "unknown parent after a new agent",
        "[[channels]]",
        '[[agents]]\nname = "newbie"\n\n[[agents]]\nname = "orphan"\nparent = "ghost"\n\n[[channels]]',
        'parent = "ghost"',
        "'ghost'",
    ),
    (
        "duplicate channel",
        "[[channels]]",
        '[[channels]]\nname = "ops"\n\n[[channels]]',
        ("[[channels]]", 2),
        "'ops' appears twice",
    ),
]


@pytest.mark.parametrize(("case", "old", "new", "where", "says"), BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_a_bad_file_changes_nothing_and_names_its_line(imported, case, old, new, where, says):
    text = POLICY.replace(old, new, 1)
    assert text != POLICY
    line = line_of(text, *where) if isinstance(where, tuple) else line_of(text, where)
    before = snapshot()
    with pytest.raises(PolicyFileError) as raised:
        # Changes that would apply before the fault is found: none of them may stay.
        policy_import(
            text=text.replace("note_search", "note_searching").replace('exec_tier = "ask"', 'exec_tier = "full"')
        )
    assert raised.value.line == line, (raised.value.message, line)
    assert raised.value.message.startswith(f"line {line}: "), raised.value.message
    assert says in raised.value.message, raised.value.message
    assert snapshot() == before
    assert not Agent.objects.filter(name__in=["newbie", "orphan"]).exists()


def _refusing_section(value):
    """A section another app would own: it stores nothing and refuses its second rule, naming only a path."""
    if len(value.get("rules", [])) > 1:
        raise PolicyFileError(f"gadget.rules.1: rule {value['rules'][1]['name']!r} is not allowed", None)
    if value.get("broken"):
        raise PolicyFileError("the gadget is broken", None)


@pytest.mark.parametrize(
    ("section", "where"),
    [
        ('[[gadget.rules]]\nname = "a"\n\n[[gadget.rules]]\nname = "b"\n', ("[[gadget.rules]]", 2)),
        ("broken = true\n", "[gadget]"),
    ],
)
def test_a_section_error_without_a_line_gets_its_sections_line_and_changes_nothing(
    imported, monkeypatch, section, where
):
    monkeypatch.setitem(SECTIONS, "gadget", Section("gadget", _refusing_section, dict))
    text = POLICY.replace('"note_search" = "allow"', '"note_search" = "deny"') + "\n[gadget]\n" + section
    before = snapshot()
    with pytest.raises(PolicyFileError) as raised:
        policy_import(text=text)
    line = line_of(text, *where) if isinstance(where, tuple) else line_of(text, where)
    assert raised.value.line == line, raised.value.message
    assert snapshot() == before


def test_the_command_reports_the_line_and_that_nothing_changed(imported, tmp_path):
    bad = tmp_path / "aleph.toml"
    bad.write_text(POLICY.replace('"note_write" = "allow"', '"note_write" = "sometimes"'))
    before = snapshot()
    with pytest.raises(CommandError) as raised:
        call_command("policy", "import", str(bad))
    line = line_of(bad.read_text(), '"note_write" = "sometimes"')
    assert f"line {line}:" in str(raised.value)
    assert "nothing was changed" in str(raised.value)
    assert snapshot() == before


def test_export_then_import_changes_nothing(imported):
    admin = imported.admin.user
    ToolPermission.objects.create(
        scope=Scope.CHANNEL, channel=imported.lab, pattern="note_?rite", action="deny", note="a note", changed_by=admin
    )
    imported.nightly.exec_tier = "full"
    imported.nightly.save()
    before = snapshot()
    exported = policy_export()
    assert tomllib.loads(exported)["agents"][0]["name"] == "builder"
    # The documented layout, which a person can extend by appending blocks.
    assert exported.count("[[agents]]\n") == 3 and exported.count("[[channels]]\n") == 3
    assert '[channels.tool_permissions]\n"note_?rite" = { action = "deny", note = "a note" }\n' in exported
    assert 'operators = ["olive"]\n' in exported
    summary = policy_import(text=exported)
    assert summary["new_agent_tokens"] == {}
    assert summary["removed_entries"] == 0
    assert snapshot() == before
    assert policy_export() == exported


def test_importing_the_same_file_twice_changes_nothing_the_second_time(imported):
    before = snapshot()
    summary = policy_import(text=POLICY)
    assert (summary["removed_entries"], summary["new_agent_tokens"]) == (0, {})
    assert snapshot() == before


def test_entries_not_in_the_file_are_removed_and_the_rest_untouched(imported):
    ToolPermission.objects.create(scope=Scope.AGENT, agent=imported.scout.agent, pattern="note_write", action="deny")
    kept = {p.pattern: (p.id, p.changed_at) for p in ToolPermission.objects.filter(scope=Scope.GLOBAL)}
    text = POLICY.replace('"github__*" = "deny"\n', "").replace('"note_search" = "allow"', '"note_search" = "ask"')
    summary = policy_import(text=text)
    assert summary["removed_entries"] == 2
    assert not ToolPermission.objects.filter(pattern="github__*").exists()
    assert not ToolPermission.objects.filter(agent=imported.scout.agent).exists()
    vault = ToolPermission.objects.get(pattern="vault_*")
    assert (vault.id, vault.changed_at) == kept["vault_*"]
    search = ToolPermission.objects.get(pattern="note_search")
    assert search.id == kept["note_search"][0]
    assert (search.action, search.changed_at > kept["note_search"][1]) == ("ask", True)


def test_agents_and_channels_missing_from_the_file_are_left_alone(imported):
    scout, lab, nightly = imported.scout.agent, imported.lab, imported.nightly
    scout.exec_tier = "full"
    scout.save()
    nightly.max_tier = "ask"
    nightly.save()
    untouched = (
        list(Agent.objects.filter(name__in=["scout", "helper"]).values()),
        list(Channel.objects.filter(name__in=["lab", "nightly"]).values()),
        sorted(
            Channel.operators.through.objects.filter(channel__in=[lab, nightly]).values_list("channel_id", "user_id")
        ),
    )
    minimal = '[policies]\nexec_tier = "auto"\n\n[[agents]]\nname = "builder"\n\n[[channels]]\nname = "ops"\n'
    policy_import(text=minimal)
    assert untouched == (
        list(Agent.objects.filter(name__in=["scout", "helper"]).values()),
        list(Channel.objects.filter(name__in=["lab", "nightly"]).values()),
        sorted(
            Channel.operators.through.objects.filter(channel__in=[lab, nightly]).values_list("channel_id", "user_id")
        ),
    )
    assert not ToolPermission.objects.exists()
    assert policy_state().exec_tier == "auto"
    assert Agent.objects.get(name="builder").exec_tier is None
    ops = Channel.objects.get(name="ops")
    assert (ops.max_tier, ops.approval_timeout_s, ops.operators.count()) == (None, 120, 0)


def test_an_import_takes_effect_on_the_next_call(imported, as_builder):
    first = as_builder.post(
        "/api/v1/calls/", {"tool": "note_search", "input": {"query": "x"}, "channel": "ops"}, format="json"
    )
    assert first.json()["decision"]["rule"] == "global:note_search"
    policy_import(text=POLICY.replace('"note_search" = "allow"', '"note_search" = "deny"'))
    second = as_builder.post(
        "/api/v1/calls/", {"tool": "note_search", "input": {"query": "x"}, "channel": "ops"}, format="json"
    )
    assert (second.json()["status"], second.json()["decision"]["rule"]) == ("denied", "global:note_search")


def _supported_sections_only(text: str) -> str:
    """Drop the top-level tables no installed app has registered yet, keeping every other line as written."""
    known = {"policies", "agents", "channels", *SECTIONS}
    kept, keep = [], True
    for line in text.splitlines(keepends=True):
        header = re.match(r"^\[\[?\s*([A-Za-z0-9_-]+)", line)
        if header:
            keep = header.group(1) in known
        if keep:
            kept.append(line)
    return "".join(kept)


def test_the_api_md_example_imports(cast):
    user_create(name="alice", role="operator")
    text = _supported_sections_only(API_MD_EXAMPLE)
    assert "[[channels]]" in text and "[policies.tool_permissions]" in text
    policy_import(text=text)
    labels = {(p.rule_label, p.action) for p in ToolPermission.objects.select_related("agent", "channel")}
    assert labels == {
        ("global:bash_exec", "ask"),
        ("global:github__*", "deny"),
        ("agent:builder:file_ops", "allow"),
        ("channel:ops:web_fetch", "deny"),
    }
    ops = Channel.objects.get(name="ops")
    assert (ops.kind, ops.max_tier, ops.approval_timeout_s) == ("web", "auto", 120)
    assert [u.username for u in ops.operators.all()] == ["alice"]
    before = snapshot()
    policy_import(text=policy_export())
    after = snapshot()
    # Sections other apps own may mark the policy changed on every import; the stored rows must not change.
    before.pop("state"), after.pop("state")
    assert after == before


def test_the_embedded_example_is_api_md_verbatim():
    api_md = shared_path("API.md")
    block = re.search(r"## Policy as code.*?```toml\n(.*?)```", api_md.read_text(), re.S)
    assert block is not None
    assert block.group(1) == API_MD_EXAMPLE
