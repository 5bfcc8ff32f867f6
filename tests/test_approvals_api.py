"""The approvals REST API and pages: operators see and decide only their channels' requests, agents never."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from approvals_app.models import Grant, Status
from tests.approvals_support import make_pending
from tests.conftest import client_for
from tools_app.models import ToolCall
from tools_app.services import session_open

pytestmark = pytest.mark.django_db


@pytest.fixture
def pending(cast):
    return {"ops": make_pending(cast, channel=cast.ops), "lab": make_pending(cast, channel=cast.lab)}


def listed(person, **query):
    response = client_for(person.token).get("/api/v1/approvals/", {"status": "pending", **query})
    assert response.status_code == 200, response.content
    return {card["channel"] for card in response.json()}


def decide(token, request, **body):
    return client_for(token).post(f"/api/v1/approvals/{request.id}/decide/", body, format="json")


def test_each_person_lists_only_what_they_may_decide(cast, pending):
    assert listed(cast.operator) == {"ops"}
    assert listed(cast.other_operator) == {"lab"}
    assert listed(cast.admin) == {"ops", "lab"}
    card = client_for(cast.operator.token).get("/api/v1/approvals/?status=pending").json()[0]
    assert card["id"] == str(pending["ops"].id)
    assert card["arguments"] == {"text": "hello"} and card["rule"] == "tier:ask" and card["status"] == "pending"


@pytest.mark.parametrize("who", ["auditor", "outsider", "builder"])
def test_auditors_outsiders_and_agents_get_403(cast, pending, who):
    token = getattr(cast, who).token
    response = client_for(token).get("/api/v1/approvals/?status=pending")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
    assert decide(token, pending["ops"], decision="approve").status_code == 403


def test_anonymous_gets_401(pending):
    response = APIClient().get("/api/v1/approvals/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"


def test_the_first_decision_wins_and_the_second_gets_409_with_who(cast, pending):
    first = decide(cast.operator.token, pending["ops"], decision="approve", scope="once", reason="ok")
    assert first.status_code == 200, first.content
    assert (first.json()["status"], first.json()["decided_by"]) == ("approved", "olive")
    assert ToolCall.objects.get(id=pending["ops"].call_id).status == "running"
    second = decide(cast.admin.token, pending["ops"], decision="deny")
    assert second.status_code == 409
    assert second.json()["error"] == {
        "code": "already_decided",
        "message": "Already decided by olive (approved).",
        "detail": {"status": "approved", "decided_by": "olive"},
    }


def test_another_channels_request_is_404_for_an_operator(cast, pending):
    response = decide(cast.operator.token, pending["lab"], decision="approve")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert client_for(cast.operator.token).get(f"/api/v1/approvals/{pending['lab'].id}/").status_code == 404
    pending["lab"].refresh_from_db()
    assert pending["lab"].status == Status.PENDING


def test_always_creates_a_grant_and_deny_touches_none(cast, pending):
    assert decide(cast.operator.token, pending["ops"], decision="approve", scope="always").status_code == 200
    grant = Grant.objects.get()
    assert (grant.tool, grant.fingerprint, grant.scope, grant.granted_by) == (
        "note_write",
        pending["ops"].fingerprint,
        "always",
        cast.operator.user,
    )
    assert decide(cast.other_operator.token, pending["lab"], decision="deny", reason="no").status_code == 200
    assert Grant.objects.count() == 1


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"decision": "maybe"}, "invalid_request"),
        ({"decision": "approve", "scope": "forever"}, "invalid_request"),
        ({"decision": "approve", "agent": "builder"}, "invalid_request"),
        ({"decision": "deny", "scope": "always"}, "invalid_scope"),
        ({"decision": "approve", "scope": "session"}, "no_session"),
        ({"decision": "approve", "scope": "until"}, "invalid_until"),
        ({"decision": "approve", "scope": "until", "until": "2001-01-01T00:00:00Z"}, "invalid_until"),
        ({"decision": "approve", "scope": "once", "until": "2999-01-01T00:00:00Z"}, "invalid_until"),
    ],
)
def test_bad_decisions_are_400_and_change_nothing(cast, pending, body, code):
    response = decide(cast.operator.token, pending["ops"], **body)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == code
    pending["ops"].refresh_from_db()
    assert pending["ops"].status == Status.PENDING


def test_an_until_grant_and_a_session_grant(cast):
    session = session_open(agent_id=cast.builder.agent.id, key="s1")
    in_session = make_pending(cast, channel=cast.ops, session=session)
    until = timezone.now() + timedelta(hours=2)
    response = decide(
        cast.operator.token, in_session, decision="approve", scope="until", until=until.isoformat(), match="tool"
    )
    assert response.status_code == 200, response.content
    grant = Grant.objects.get()
    assert (grant.fingerprint, grant.expires_at, grant.session) == ("", until, None)
    other = make_pending(cast, channel=cast.ops, session=session)
    assert decide(cast.operator.token, other, decision="approve", scope="session").status_code == 200
    assert Grant.objects.get(scope="session").session == session


def test_a_request_past_its_deadline_cannot_be_approved(cast):
    late = make_pending(cast, channel=cast.ops, seconds=-1)
    response = decide(cast.operator.token, late, decision="approve")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "expired"


def test_the_status_filter(cast, pending):
    decide(cast.operator.token, pending["ops"], decision="deny", reason="no")
    client = client_for(cast.admin.token)
    assert [c["status"] for c in client.get("/api/v1/approvals/?status=denied").json()] == ["denied"]
    assert len(client.get("/api/v1/approvals/").json()) == 2
    assert client.get("/api/v1/approvals/?status=bogus").status_code == 400


def test_the_browser_session_needs_a_csrf_token_to_decide(cast, pending):
    browser = APIClient(enforce_csrf_checks=True)
    browser.force_login(cast.operator.user)
    response = browser.post(f"/api/v1/approvals/{pending['ops'].id}/decide/", {"decision": "approve"}, format="json")
    assert response.status_code == 403
    pending["ops"].refresh_from_db()
    assert pending["ops"].status == Status.PENDING


# -- pages ----------------------------------------------------------------------------------------


def page_client(person):
    client = Client()
    client.force_login(person.user)
    return client


def test_the_operators_page_is_for_operators_and_admins(cast):
    page = page_client(cast.operator).get("/approvals/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'href="/approvals/"' in html and "approvals.js" in html and 'data-ws="/ws/approvals/"' in html
    assert "You decide: ops" in html
    assert page_client(cast.admin).get("/approvals/").status_code == 200
    assert page_client(cast.auditor).get("/approvals/").status_code == 403
    assert page_client(cast.outsider).get("/approvals/grants/").status_code == 403
    assert Client().get("/approvals/").status_code == 302


def test_the_history_tab_shows_my_channels_decisions(cast, pending):
    decide(cast.operator.token, pending["ops"], decision="deny", reason="ops reason")
    decide(cast.other_operator.token, pending["lab"], decision="deny", reason="lab reason")
    html = page_client(cast.operator).get("/approvals/history/").content.decode()
    assert "ops reason" in html and "lab reason" not in html


def test_grants_page_lists_and_revokes(cast, pending):
    decide(cast.operator.token, pending["ops"], decision="approve", scope="always")
    grant = Grant.objects.get()
    html = page_client(cast.operator).get("/approvals/grants/").content.decode()
    assert f"/approvals/grants/{grant.id}/revoke/" in html
    assert (
        f"/approvals/grants/{grant.id}/revoke/"
        not in page_client(cast.other_operator).get("/approvals/grants/").content.decode()
    )

    page_client(cast.other_operator).post(f"/approvals/grants/{grant.id}/revoke/")
    grant.refresh_from_db()
    assert grant.revoked_at is None

    response = page_client(cast.operator).post(f"/approvals/grants/{grant.id}/revoke/", follow=True)
    assert response.status_code == 200
    grant.refresh_from_db()
    assert grant.revoked_at is not None and grant.revoked_by == cast.operator.user
    assert "Revoked the grant" in response.content.decode()
    assert page_client(cast.operator).get(f"/approvals/grants/{grant.id}/revoke/").status_code == 405


def test_the_nav_bar_links_approvals_for_operators_only(cast):
    assert 'href="/approvals/"' in page_client(cast.operator).get("/").content.decode()
    assert 'href="/approvals/"' not in page_client(cast.auditor).get("/").content.decode()
