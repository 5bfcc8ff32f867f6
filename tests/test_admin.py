"""The admin console: a channel's rules edited inline take effect on the next explain; the event log is read-only."""

from html.parser import HTMLParser

import httpx
import pytest
from django.test import Client

from tests.conftest import client_for, make_cast
from tools_app.models import Channel, PolicyState, Scope, ToolCall, ToolPermission
from tools_app.policy_store import current_policy

EXPLAIN = "/api/v1/policy/explain/"


class FormFields(HTMLParser):
    """The values a browser would submit for the form with id `form_id`, as the page rendered them."""

    def __init__(self, form_id: str):
        super().__init__()
        self.form_id = form_id
        self.inside = False
        self.data: list[tuple[str, str]] = []
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form":
            self.inside = attrs.get("id") == self.form_id
        if not self.inside or "name" not in attrs and tag != "option":
            return
        if tag == "input":
            kind = attrs.get("type", "text")
            if kind in ("submit", "button", "file", "image"):
                return
            if kind in ("checkbox", "radio") and "checked" not in attrs:
                return
            self.data.append((attrs["name"], attrs.get("value", "on" if kind == "checkbox" else "")))
        elif tag == "select":
            self._select = attrs["name"]
        elif tag == "option" and self._select and "selected" in attrs:
            self.data.append((self._select, attrs.get("value", "")))
        elif tag == "textarea":
            self._textarea = attrs["name"]
            self.data.append((self._textarea, ""))

    def handle_data(self, data):
        if self._textarea:
            name, value = self.data.pop()
            self.data.append((name, value + data))

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None
        elif tag == "form":
            self.inside = False


def form_data(html: str, form_id: str) -> dict[str, list[str]]:
    parser = FormFields(form_id)
    parser.feed(html)
    data: dict[str, list[str]] = {}
    for name, value in parser.data:
        data.setdefault(name, []).append(value)
    return data


def admin_client(cast) -> Client:
    client = Client()
    assert client.login(username="admin", password=cast.admin.password)
    return client


def add_channel_rule(client: Client, channel: Channel, pattern: str, action: str, note: str = ""):
    """Submit the channel's change form with one more row in its permissions inline, as a person would."""
    url = f"/admin/tools_app/channel/{channel.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200
    data = form_data(page.content.decode(), "channel_form")
    prefix = next(name[: -len("-TOTAL_FORMS")] for name in data if name.endswith("-TOTAL_FORMS"))
    row = int(data[f"{prefix}-INITIAL_FORMS"][0])
    for key in [k for k in data if k.startswith(f"{prefix}-{row}-")]:
        del data[key]
    data[f"{prefix}-{row}-pattern"] = [pattern]
    data[f"{prefix}-{row}-action"] = [action]
    data[f"{prefix}-{row}-note"] = [note]
    data[f"{prefix}-{row}-channel"] = [str(channel.pk)]
    data[f"{prefix}-TOTAL_FORMS"] = [str(max(row + 1, int(data[f"{prefix}-TOTAL_FORMS"][0])))]
    data["_continue"] = ["Save and continue editing"]
    response = client.post(url, data)
    assert response.status_code == 302, response.content.decode()[:3000]
    return response


def explain(token: str, tool: str = "note_write", channel: str = "ops") -> dict:
    body = {"agent": "builder", "channel": channel, "tool": tool, "input": {"text": "x"}}
    response = client_for(token).post(EXPLAIN, body, format="json")
    assert response.status_code == 200, response.content
    return response.json()["decision"]


def test_a_channel_rule_added_inline_takes_effect_on_the_next_explain(cast):
    before = explain(cast.admin.token)
    assert (before["verdict"], before["rule"]) == ("ask", "tier:ask")
    old_version = current_policy().version
    client = admin_client(cast)
    add_channel_rule(client, cast.ops, "note_*", "deny", "no notes in ops")
    entry = ToolPermission.objects.get(scope=Scope.CHANNEL, channel=cast.ops)
    assert (entry.pattern, entry.action, entry.note) == ("note_*", "deny", "no notes in ops")
    assert entry.changed_by == cast.admin.user
    assert PolicyState.objects.get().version != old_version
    after = explain(cast.admin.token)
    assert (after["verdict"], after["decided_by"], after["rule"]) == ("deny", "entry", "channel:ops:note_*")
    assert current_policy().version == PolicyState.objects.get().version
    assert explain(cast.operator.token)["rule"] == "channel:ops:note_*"
    assert explain(cast.other_operator.token, channel="lab")["rule"] == "tier:ask"
    listed = {t["name"] for t in client_for(cast.builder.token).get("/api/v1/tools/", {"channel": "ops"}).json()}
    assert "note_write" not in listed and "vault_store" in listed


def test_editing_and_deleting_a_rule_inline_is_stamped_and_takes_effect(cast):
    client = admin_client(cast)
    add_channel_rule(client, cast.ops, "note_write", "allow")
    assert explain(cast.admin.token)["rule"] == "channel:ops:note_write"
    entry = ToolPermission.objects.get(channel=cast.ops)
    entry.changed_by = None
    entry.save()
    url = f"/admin/tools_app/channel/{cast.ops.pk}/change/"
    data = form_data(client.get(url).content.decode(), "channel_form")
    prefix = next(name[: -len("-TOTAL_FORMS")] for name in data if name.endswith("-TOTAL_FORMS"))
    data[f"{prefix}-0-action"] = ["ask"]
    assert client.post(url, data).status_code == 302
    entry.refresh_from_db()
    assert (entry.action, entry.changed_by) == ("ask", cast.admin.user)
    assert explain(cast.admin.token)["verdict"] == "ask"
    data = form_data(client.get(url).content.decode(), "channel_form")
    data[f"{prefix}-0-DELETE"] = ["on"]
    assert client.post(url, data).status_code == 302
    assert not ToolPermission.objects.exists()
    assert explain(cast.admin.token)["rule"] == "tier:ask"


def test_a_global_rule_added_in_the_admin_records_the_admin(cast):
    client = admin_client(cast)
    page = client.get("/admin/tools_app/globaltoolpermission/add/")
    assert page.status_code == 200
    data = form_data(page.content.decode(), "globaltoolpermission_form")
    data.update(pattern=["note_search"], action=["deny"], note=["audit"])
    assert client.post("/admin/tools_app/globaltoolpermission/add/", data).status_code == 302
    entry = ToolPermission.objects.get()
    assert (entry.scope, entry.changed_by) == (Scope.GLOBAL, cast.admin.user)
    assert explain(cast.admin.token, tool="note_search")["rule"] == "global:note_search"


def test_the_event_log_is_read_only(cast):
    response = client_for(cast.builder.token).post(
        "/api/v1/calls/", {"tool": "note_search", "input": {"query": "x"}, "channel": "ops"}, format="json"
    )
    call = ToolCall.objects.get(id=response.json()["id"])
    client = admin_client(cast)
    listing = client.get("/admin/tools_app/toolcall/")
    assert listing.status_code == 200
    assert "note_search" in listing.content.decode()
    assert "/admin/tools_app/toolcall/add/" not in listing.content.decode()
    page = client.get(f"/admin/tools_app/toolcall/{call.pk}/change/")
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    assert client.post(f"/admin/tools_app/toolcall/{call.pk}/change/", {"status": "succeeded"}).status_code == 403
    assert client.get("/admin/tools_app/toolcall/add/").status_code == 403
    assert client.post(f"/admin/tools_app/toolcall/{call.pk}/delete/", {"post": "yes"}).status_code == 403
    bulk = client.post("/admin/tools_app/toolcall/", {"action": "delete_selected", "_selected_action": [str(call.pk)]})
    assert bulk.status_code in (200, 302, 403)
    call.refresh_from_db()
    assert (call.status, call.tool) == ("succeeded", "note_search")


@pytest.mark.parametrize("who", ["operator", "auditor", "outsider"])
def test_only_admins_reach_the_admin(cast, who):
    person = getattr(cast, who)
    client = Client()
    assert client.login(username=person.user.username, password=person.password)
    response = client.get("/admin/tools_app/channel/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert client.post(f"/admin/tools_app/channel/{cast.ops.pk}/change/", {"name": "hijacked"}).status_code == 302
    assert Channel.objects.filter(name="ops").exists()


def test_a_change_in_the_admin_reaches_a_running_server_process(daphne_server):
    cast = make_cast()
    headers = {"Authorization": f"Bearer {cast.admin.token}"}
    body = {"agent": "builder", "channel": "ops", "tool": "note_write", "input": {"text": "x"}}
    url = f"{daphne_server.url}{EXPLAIN}"
    warm = httpx.post(url, json=body, headers=headers, timeout=30)
    assert warm.json()["decision"]["rule"] == "tier:ask"
    add_channel_rule(admin_client(cast), cast.ops, "note_write", "deny")
    after = httpx.post(url, json=body, headers=headers, timeout=30)
    assert after.json()["decision"]["rule"] == "channel:ops:note_write"
