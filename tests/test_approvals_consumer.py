"""The operators' websocket: authenticated on connect, authorized on every event, through the real ASGI stack."""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from aleph_site.asgi import application
from approvals_app.models import ApprovalRequest, Status
from tests.approvals_support import _close_worker_connections, parked_request, start_call  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
async def _fresh_layer():
    await get_channel_layer().flush()
    yield
    await get_channel_layer().flush()


@sync_to_async
def session_cookie(person):
    client = Client()
    client.force_login(person.user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


async def socket_for(person=None, origin=b"http://127.0.0.1"):
    headers = [(b"origin", origin)]
    if person is not None:
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={await session_cookie(person)}".encode()))
    communicator = WebsocketCommunicator(application, "/ws/approvals/", headers=headers)
    connected, _ = await communicator.connect(timeout=5)
    return communicator, connected


async def connected_socket(person):
    communicator, connected = await socket_for(person)
    assert connected
    snapshot = await communicator.receive_json_from(timeout=5)
    assert snapshot["type"] == "approval.snapshot"
    return communicator, snapshot


async def receive_types(communicator, count):
    messages = [await communicator.receive_json_from(timeout=5) for _ in range(count)]
    return {message["type"]: message for message in messages}


async def test_anonymous_is_refused(cast):
    communicator, connected = await socket_for(None)
    assert not connected
    await communicator.disconnect()


async def test_people_who_decide_nothing_are_refused(cast):
    for person in (cast.auditor, cast.outsider):
        communicator, connected = await socket_for(person)
        assert not connected, person.user.username
        await communicator.disconnect()


async def test_a_foreign_origin_is_refused_even_with_a_session(cast):
    communicator, connected = await socket_for(cast.operator, origin=b"http://evil.example")
    assert not connected
    await communicator.disconnect()


async def test_the_right_operator_gets_the_card_then_its_resolution_and_no_one_else_does(cast):
    olive, _ = await connected_socket(cast.operator)
    otto, _ = await connected_socket(cast.other_operator)
    admin, _ = await connected_socket(cast.admin)

    task = await start_call(cast.builder.agent, "note_write", {"text": "x" * 500}, session="s1")
    requested = await olive.receive_json_from(timeout=5)
    assert requested["type"] == "approval.requested"
    card = requested["request"]
    assert (card["tool"], card["agent"], card["channel"], card["session"]) == ("note_write", "builder", "ops", "s1")
    assert card["arguments"] == {"text": "x" * 500}
    assert (card["rule"], card["asked_by"], card["status"]) == ("tier:ask", "tier", "pending")
    assert "Ask tier" in card["reason"] and card["deadline"] > card["created_at"]
    assert (await admin.receive_json_from(timeout=5))["request"]["id"] == card["id"]
    assert await otto.receive_nothing(timeout=0.5)

    await olive.send_json_to({"type": "decide", "id": card["id"], "decision": "approve", "scope": "once"})
    answers = await receive_types(olive, 2)
    assert answers["decide.ok"] == {"type": "decide.ok", "id": card["id"], "status": "approved"}
    resolution = answers["approval.resolved"]["resolution"]
    assert (resolution["id"], resolution["status"], resolution["decided_by"]) == (card["id"], "approved", "olive")
    assert (await admin.receive_json_from(timeout=5))["resolution"]["decided_by"] == "olive"
    assert (await asyncio.wait_for(task, 5)).status == "succeeded"
    assert await otto.receive_nothing(timeout=0.5)

    # The other operator cannot decide it either, even by naming its id.
    await otto.send_json_to({"type": "decide", "id": card["id"], "decision": "deny"})
    refused = await otto.receive_json_from(timeout=5)
    assert refused["type"] == "decide.error" and refused["error"]["code"] == "not_found"
    for communicator in (olive, otto, admin):
        await communicator.disconnect()


async def test_a_second_decision_hears_who_decided_first(cast):
    olive, _ = await connected_socket(cast.operator)
    admin, _ = await connected_socket(cast.admin)
    task = await start_call(cast.builder.agent, "note_write", {"text": "race"})
    card = (await olive.receive_json_from(timeout=5))["request"]
    await admin.receive_json_from(timeout=5)
    await admin.send_json_to({"type": "decide", "id": card["id"], "decision": "deny", "reason": "no"})
    await receive_types(admin, 2)
    await olive.receive_json_from(timeout=5)  # the resolution
    await olive.send_json_to({"type": "decide", "id": card["id"], "decision": "approve"})
    late = await olive.receive_json_from(timeout=5)
    assert late["type"] == "decide.error"
    assert late["error"]["code"] == "already_decided"
    assert late["error"]["message"] == "Already decided by admin (denied)."
    assert (await asyncio.wait_for(task, 5)).decision.reason == "Denied by admin: no"
    await olive.disconnect()
    await admin.disconnect()


async def test_every_event_is_authorized_afresh(cast):
    olive, _ = await connected_socket(cast.operator)
    first = await start_call(cast.builder.agent, "note_write", {"text": "one"})
    card = (await olive.receive_json_from(timeout=5))["request"]

    await sync_to_async(cast.ops.operators.remove)(cast.operator.user)
    await olive.send_json_to({"type": "decide", "id": card["id"], "decision": "approve"})
    refused = await olive.receive_json_from(timeout=5)
    assert refused["type"] == "decide.error" and refused["error"]["code"] == "not_found"
    second = await start_call(cast.builder.agent, "note_write", {"text": "two"})
    await parked_request(arguments__text="two")
    assert await olive.receive_nothing(timeout=0.5)

    await sync_to_async(cast.ops.operators.add)(cast.operator.user)
    third = await start_call(cast.builder.agent, "note_write", {"text": "three"})
    assert (await olive.receive_json_from(timeout=5))["request"]["arguments"] == {"text": "three"}
    for task in (first, second, third):
        task.cancel()
    await asyncio.gather(first, second, third, return_exceptions=True)
    await olive.disconnect()


async def test_the_snapshot_on_connect_holds_the_pending_cards_of_my_channels(cast):
    task = await start_call(cast.builder.agent, "note_write", {"text": "waiting"})
    request = await parked_request()
    lab_task = await start_call(cast.builder.agent, "note_write", {"text": "lab"}, channel="lab")
    await parked_request(channel__name="lab")
    olive, snapshot = await connected_socket(cast.operator)
    assert [card["id"] for card in snapshot["requests"]] == [str(request.id)]
    admin, admin_snapshot = await connected_socket(cast.admin)
    assert len(admin_snapshot["requests"]) == 2
    for pending in (task, lab_task):
        pending.cancel()
    await asyncio.gather(task, lab_task, return_exceptions=True)
    await olive.disconnect()
    await admin.disconnect()


async def test_an_expiry_reaches_the_operator(cast):
    cast.ops.approval_timeout_s = 1
    await sync_to_async(cast.ops.save)()
    olive, _ = await connected_socket(cast.operator)
    task = await start_call(cast.builder.agent, "note_write", {"text": "late"})
    card = (await olive.receive_json_from(timeout=5))["request"]
    expired = await olive.receive_json_from(timeout=5)
    assert expired["type"] == "approval.expired"
    assert (expired["resolution"]["id"], expired["resolution"]["status"]) == (card["id"], "expired")
    assert (await asyncio.wait_for(task, 5)).status == "expired"
    assert (await ApprovalRequest.objects.aget(pk=card["id"])).status == Status.EXPIRED
    await olive.disconnect()


async def test_a_malformed_message_gets_an_error_not_a_crash(cast):
    olive, _ = await connected_socket(cast.operator)
    await olive.send_to(text_data="{not json")
    assert (await olive.receive_json_from(timeout=5))["error"]["code"] == "invalid_json"
    await olive.send_json_to({"type": "subscribe"})
    assert (await olive.receive_json_from(timeout=5))["error"]["code"] == "unknown_message"
    await olive.send_json_to({"type": "decide", "id": "not-a-uuid", "decision": "approve"})
    assert (await olive.receive_json_from(timeout=5))["error"]["code"] == "invalid_request"
    await olive.disconnect()
