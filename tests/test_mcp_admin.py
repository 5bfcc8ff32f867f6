"""MCP servers as data: aleph.toml's [[mcp_servers]], the admin console, and the MCP servers page."""

import pytest
from django.test import Client
from django.urls import reverse

from tools_app.models import McpServer
from tools_app.policy_toml import PolicyFileError, policy_export, policy_import

POLICY = """
[policies]
exec_tier = "ask"

[[mcp_servers]]
name = "everything"
transport = "stdio"
command = "npx"
args = ["-y", "@modelcontextprotocol/server-everything"]

[[mcp_servers]]
name = "internal"
transport = "http"
url = "http://mcp.internal.example:8080/mcp"
network_allow = ["10.20.0.0/16"]
call_timeout_s = 30
[mcp_servers.headers]
X-Api-Key = "secret-key"
"""


def signed_in(person) -> Client:
    client = Client()
    assert client.login(username=person.user.username, password=person.password)
    return client


def test_policy_import_creates_and_updates_servers_and_export_round_trips(cast):
    McpServer.objects.create(name="untouched", transport="stdio", command="true")
    policy_import(text=POLICY)
    everything = McpServer.objects.get(name="everything")
    assert (everything.transport, everything.command, everything.args) == (
        "stdio",
        "npx",
        ["-y", "@modelcontextprotocol/server-everything"],
    )
    internal = McpServer.objects.get(name="internal")
    assert internal.headers == {"X-Api-Key": "secret-key"} and internal.network_allow == ["10.20.0.0/16"]
    assert internal.call_timeout_s == 30 and internal.enabled is True
    assert McpServer.objects.filter(name="untouched").exists()  # servers missing from the file are left alone

    policy_import(text=POLICY.replace("call_timeout_s = 30", "call_timeout_s = 45\nenabled = false"))
    internal.refresh_from_db()
    assert (internal.call_timeout_s, internal.enabled) == (45, False)

    exported = policy_export()
    assert "[[mcp_servers]]" in exported
    before = list(McpServer.objects.order_by("name").values())
    policy_import(text=exported)
    after = list(McpServer.objects.order_by("name").values())
    assert [{k: v for k, v in row.items() if k != "changed_at"} for row in before] == [
        {k: v for k, v in row.items() if k != "changed_at"} for row in after
    ]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('name = "x"\ntransport = "stdio"', "command"),
        ('name = "x"\ntransport = "http"\nurl = "ftp://x"', "url"),
        ('name = "x"\ntransport = "carrier-pigeon"\ncommand = "y"', "transport"),
        ('name = "bad name"\ncommand = "y"', "name"),
        ('name = "x"\ncommand = "y"\nsurprise = 1', "surprise"),
        ('name = "x"\ntransport = "http"\nurl = "http://x/"\nnetwork_allow = ["not an address!"]', "network_allow"),
        ('name = "x"\ncommand = "y"\nenv = { KEY = "${ALEPH_SECRET_KEY}" }', "Aleph's own settings"),
    ],
)
def test_a_bad_server_entry_is_refused_whole_with_its_location(cast, entry, message):
    text = f'[[mcp_servers]]\nname = "fine"\ncommand = "ok"\n\n[[mcp_servers]]\n{entry}\n'
    with pytest.raises(PolicyFileError) as refused:
        policy_import(text=text)
    assert "mcp_servers.1" in str(refused.value) and message in str(refused.value)
    assert refused.value.line is not None and refused.value.line >= 5  # the line of the bad entry
    assert not McpServer.objects.exists()  # all-or-nothing


def test_the_admin_console_adds_and_validates_servers(cast):
    admin = signed_in(cast.admin)
    add = reverse("admin:tools_app_mcpserver_add")
    form = {
        "name": "time",
        "transport": "stdio",
        "command": "python",
        "args": '["-m", "mcp_server_time"]',
        "env": "{}",
        "url": "",
        "headers": "{}",
        "network_allow": "[]",
        "enabled": "on",
        "call_timeout_s": "60",
    }
    refused = admin.post(add, {**form, "command": ""})
    assert refused.status_code == 200 and "needs the command" in refused.content.decode()
    created = admin.post(add, form)
    assert created.status_code == 302
    server = McpServer.objects.get(name="time")
    assert server.args == ["-m", "mcp_server_time"] and server.changed_by == cast.admin.user
    assert signed_in(cast.operator).get(add).status_code in (302, 403)


def test_the_mcp_servers_page_is_for_admins_and_operators(cast):
    McpServer.objects.create(
        name="gh:sub",
        transport="stdio",
        command="npx",
        args=["-y", "github-mcp"],
        env={"GITHUB_TOKEN": "ghp_secret"},
        status="error",
        last_error="The command was not found: npx.",
    )
    McpServer.objects.create(name="off", transport="stdio", command="x", enabled=False)
    url = reverse("mcp:servers")
    page = signed_in(cast.operator).get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "gh:sub" in html and "npx -y github-mcp" in html
    assert "GITHUB_TOKEN" in html and "ghp_secret" not in html  # environment names, never values
    assert "The command was not found" in html and 'data-status="error"' in html
    assert 'data-status="disabled"' in html
    assert ">MCP servers</a>" in html  # the navigation shows it
    assert signed_in(cast.admin).get(url).status_code == 200
    assert signed_in(cast.auditor).get(url).status_code == 403
    assert signed_in(cast.outsider).get(url).status_code == 403
    assert Client().get(url).status_code == 302
