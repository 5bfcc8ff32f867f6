"""The approval desk through the real chokepoint: decisions, deadlines, unattended turns and standing grants."""

import asyncio
import hashlib
import json
import threading
import time
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import Client
from django.utils import timezone

from approvals_app import desk
from approvals_app.models import ApprovalRequest, Grant, Status
from approvals_app.services import approval_decide, approval_expire_overdue, grant_revoke
from tests.approvals_support import _close_worker_connections, in_thread, make_pending, parked_request, start_call  # noqa: F401
from tools_app.chokepoint.policy import DENY, Decision
from tools_app.models import CallStatus, Scope, ToolCall, ToolPermission
from tools_app.services import ApplicationError

pytestmark = pytest.mark.django_db(transaction=True)


def decide(request, person, decision="approve", scope="once", **extra):
    return in_thread(approval_decide)(request=request, operator=person.user, decision=decision, scope=scope, **extra)


async def test_an_operator_approval_releases_the_parked_call_with_who_decided(cast):
    arguments = {"text": "remember the milk"}
    task = await start_call(cast.builder.agent, "note_write", arguments)
    request = await parked_request(tool="note_write")
    assert not task.done()
    assert (
        request.fingerprint
        == hashlib.sha256(json.dumps(arguments, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    )
    assert (request.rule, request.asked_by) == ("tier:ask", "tier")
    assert "Ask tier" in request.reason
    assert request.call.status == CallStatus.PENDING_APPROVAL
    assert request.deadline - request.created_at == timedelta(seconds=120)

    await decide(request, cast.operator, reason="fine by me")
    outcome = await asyncio.wait_for(task, 5)

    assert outcome.status == "succeeded"
    assert outcome.decision.decided_by == "operator"
    assert outcome.decision.principal == "olive"
    assert outcome.decision.approval == str(request.id)
    assert "Approved by olive" in outcome.decision.reason
    row = await ToolCall.objects.aget(id=outcome.id)
    assert (row.status, row.decided_by, row.principal, row.approval) == (
        "succeeded",
        "operator",
        "olive",
        str(request.id),
    )


async def test_a_denial_reaches_the_model_with_the_operators_reason(cast):
    task = await start_call(cast.builder.agent, "note_write", {"text": "x"})
    request = await parked_request()
    await decide(request, cast.operator, "deny", reason="use the staging notes instead")
    outcome = await asyncio.wait_for(task, 5)
    assert outcome.status == "denied"
    assert outcome.decision.reason == "Denied by olive: use the staging notes instead"
    assert outcome.result is None


async def test_the_first_of_two_concurrent_decisions_wins_and_the_other_hears_who(cast):
    for round_ in range(4):
        task = await start_call(cast.builder.agent, "note_write", {"text": f"round {round_}"})
        request = await parked_request(tool="note_write")
        barrier = threading.Barrier(2)

        def attempt(person, decision, request=request, barrier=barrier):
            barrier.wait(timeout=5)
            try:
                approval_decide(request=request, operator=person.user, decision=decision, scope="once", reason="race")
            except ApplicationError as exc:
                return ("lost", person.user.username, exc)
            return ("won", person.user.username, None)

        results = await asyncio.gather(
            in_thread(attempt)(cast.operator, "approve"), in_thread(attempt)(cast.admin, "deny")
        )
        winners = [r for r in results if r[0] == "won"]
        losers = [r for r in results if r[0] == "lost"]
        assert len(winners) == 1 and len(losers) == 1, results
        winner = winners[0][1]
        error = losers[0][2]
        assert error.status == 409 and error.code == "already_decided"
        assert f"Already decided by {winner}" in error.message
        outcome = await asyncio.wait_for(task, 5)
        assert outcome.status == ("succeeded" if winner == "olive" else "denied")
        assert outcome.decision.principal == winner
        stored = await ApprovalRequest.objects.select_related("decided_by").aget(pk=request.pk)
        assert stored.decided_by.username == winner


async def test_at_the_deadline_the_request_expires_and_the_call_is_refused(cast):
    cast.ops.approval_timeout_s = 1
    await sync_to_async(cast.ops.save)()
    started = time.monotonic()
    task = await start_call(cast.builder.agent, "note_write", {"text": "slow"})
    request = await parked_request()
    outcome = await asyncio.wait_for(task, 10)
    elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 4, elapsed
    assert outcome.status == "expired"
    assert outcome.decision.decided_by == "timeout"
    assert "refused as timed out" in outcome.decision.reason and "did not run" in outcome.decision.reason
    assert outcome.result is None
    stored = await ApprovalRequest.objects.aget(pk=request.pk)
    assert stored.status == Status.EXPIRED
    assert (await ToolCall.objects.aget(id=outcome.id)).status == "expired"
    with pytest.raises(ApplicationError) as late:
        await decide(stored, cast.operator)
    assert late.value.status == 409 and late.value.code == "expired"


async def test_an_unattended_turn_is_refused_at_once_and_no_request_waits(cast):
    started = time.monotonic()
    task = await start_call(cast.builder.agent, "note_write", {"text": "cron"}, channel="nightly")
    outcome = await asyncio.wait_for(task, 5)
    assert time.monotonic() - started < 1
    assert outcome.status == "denied"
    assert outcome.decision.decided_by == "unattended"
    assert "unattended" in outcome.decision.reason
    assert await ApprovalRequest.objects.acount() == 0
    assert (await ToolCall.objects.aget(id=outcome.id)).status == "denied"


async def test_a_lost_wake_up_costs_one_poll_not_the_call(cast):
    task = await start_call(cast.builder.agent, "note_write", {"text": "quiet"})
    request = await parked_request()

    def decide_without_telling_anyone():
        ApprovalRequest.objects.filter(pk=request.pk).update(
            status=Status.APPROVED, decided_by=cast.operator.user, decided_at=timezone.now(), scope="once"
        )

    started = time.monotonic()
    await in_thread(decide_without_telling_anyone)()
    outcome = await asyncio.wait_for(task, 5)
    assert outcome.status == "succeeded"
    assert time.monotonic() - started < 3.2


async def test_a_call_that_stops_waiting_cancels_its_card(cast):
    task = await start_call(cast.builder.agent, "note_write", {"text": "bye"})
    request = await parked_request()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stored = await ApprovalRequest.objects.aget(pk=request.pk)
    assert stored.status == Status.CANCELLED
    assert (await ToolCall.objects.aget(id=request.call_id)).status == "expired"


async def _finishes_despite_cancellation():
    try:
        await asyncio.sleep(0.5)
    except asyncio.CancelledError:
        pass  # as a channel layer's send may, once it has started


async def test_a_call_cancelled_while_its_card_is_being_announced_still_stops(cast, monkeypatch):
    """A cancellation landing while a worker thread is back on the loop (a card's broadcast) is swallowed by asgiref
    when that inner work ends normally: the thread's result comes back as if nothing happened. The desk must not
    take that for leave to go on waiting until the deadline."""
    announcing = threading.Event()
    open_card = desk.approval_open

    def open_and_announce(**kwargs):
        request = open_card(**kwargs)
        announcing.set()
        async_to_sync(_finishes_despite_cancellation)()
        return request

    monkeypatch.setattr(desk, "approval_open", open_and_announce)
    task = await start_call(cast.builder.agent, "note_write", {"text": "bye"})
    assert await asyncio.to_thread(announcing.wait, 5)
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    stored = await ApprovalRequest.objects.aget()
    assert stored.status == Status.CANCELLED
    assert (await ToolCall.objects.aget(id=stored.call_id)).status == "expired"


# -- standing grants ------------------------------------------------------------------------------


async def test_a_session_grant_applies_only_in_its_session(cast):
    arguments = {"text": "session note"}
    task = await start_call(cast.builder.agent, "note_write", arguments, session="s1")
    first = await parked_request()
    await decide(first, cast.operator, scope="session")
    assert (await asyncio.wait_for(task, 5)).status == "succeeded"

    again = await asyncio.wait_for(await start_call(cast.builder.agent, "note_write", arguments, session="s1"), 5)
    assert again.status == "succeeded"
    assert again.decision.decided_by == "grant"
    assert again.decision.principal == "olive"
    assert "for this session" in again.decision.reason
    assert await ApprovalRequest.objects.acount() == 1

    elsewhere = await start_call(cast.builder.agent, "note_write", arguments, session="s2")
    second = await parked_request(session__key="s2")
    no_session = await start_call(cast.builder.agent, "note_write", arguments)
    third = await parked_request(session__isnull=True)
    assert await ApprovalRequest.objects.acount() == 3
    await decide(second, cast.operator, "deny", reason="not in s2")
    await decide(third, cast.operator, "deny", reason="no session")
    assert (await asyncio.wait_for(elsewhere, 5)).status == "denied"
    assert (await asyncio.wait_for(no_session, 5)).status == "denied"
    grant = await Grant.objects.aget()
    assert grant.uses == 1


async def test_an_until_grant_stops_at_its_time(cast):
    arguments = {"text": "until"}
    task = await start_call(cast.builder.agent, "note_write", arguments)
    first = await parked_request()
    until = timezone.now() + timedelta(seconds=1.5)
    await decide(first, cast.operator, scope="until", until=until)
    assert (await asyncio.wait_for(task, 5)).status == "succeeded"

    within = await asyncio.wait_for(await start_call(cast.builder.agent, "note_write", arguments), 5)
    assert within.decision.decided_by == "grant"
    assert "until" in within.decision.reason

    await asyncio.sleep(max(0.0, (until - timezone.now()).total_seconds()) + 0.1)
    after = await start_call(cast.builder.agent, "note_write", arguments)
    request = await parked_request()
    assert request.pk != first.pk
    await decide(request, cast.operator, "deny", reason="grant is over")
    assert (await asyncio.wait_for(after, 5)).decision.decided_by == "operator"


async def test_a_revoked_grant_stops_at_once(cast):
    arguments = {"text": "always"}
    task = await start_call(cast.builder.agent, "note_write", arguments)
    await decide(await parked_request(), cast.operator, scope="always")
    await asyncio.wait_for(task, 5)
    assert (
        await asyncio.wait_for(await start_call(cast.builder.agent, "note_write", arguments), 5)
    ).decision.decided_by == "grant"
    # Other arguments are not covered by a grant bound to these arguments' fingerprint.
    other = await start_call(cast.builder.agent, "note_write", {"text": "something else"})
    await decide(await parked_request(), cast.operator, "deny", reason="different text")
    assert (await asyncio.wait_for(other, 5)).status == "denied"

    grant = await Grant.objects.aget()
    await in_thread(grant_revoke)(grant=grant, person=cast.operator.user)
    after = await start_call(cast.builder.agent, "note_write", arguments)
    request = await parked_request()
    await decide(request, cast.operator, "deny", reason="revoked")
    assert (await asyncio.wait_for(after, 5)).decision.decided_by == "operator"


async def test_a_grant_never_overrides_a_deny_entry(cast):
    task = await start_call(cast.builder.agent, "note_write", {"text": "a"})
    await decide(await parked_request(), cast.operator, scope="always", match="tool")
    await asyncio.wait_for(task, 5)
    granted = await asyncio.wait_for(await start_call(cast.builder.agent, "note_write", {"text": "b"}), 5)
    assert granted.decision.decided_by == "grant" and "any arguments" in granted.decision.reason

    await ToolPermission.objects.acreate(scope=Scope.CHANNEL, channel=cast.ops, pattern="note_*", action="deny")
    denied = await asyncio.wait_for(await start_call(cast.builder.agent, "note_write", {"text": "c"}), 5)
    assert denied.status == "denied"
    assert (denied.decision.decided_by, denied.decision.rule) == ("entry", "channel:ops:note_*")
    assert (await Grant.objects.aget()).uses == 1
    assert await ApprovalRequest.objects.acount() == 1


class HardlineFloor:
    """A command floor like the sandbox's hardline rules: no entry, tier or grant lowers it."""

    def check(self, tool, args, policy):
        if "rm -rf /" in getattr(args, "text", ""):
            return Decision(DENY, "floor", "command_policy:rm_root", "Deleting the root filesystem is never allowed.")
        return None


async def test_a_grant_never_overrides_the_command_floor(cast):
    floors = (HardlineFloor(),)
    task = await start_call(cast.builder.agent, "note_write", {"text": "a"}, floors=floors)
    await decide(await parked_request(), cast.operator, scope="always", match="tool")
    await asyncio.wait_for(task, 5)
    allowed = await asyncio.wait_for(
        await start_call(cast.builder.agent, "note_write", {"text": "ok"}, floors=floors), 5
    )
    assert allowed.decision.decided_by == "grant"

    refused = await asyncio.wait_for(
        await start_call(cast.builder.agent, "note_write", {"text": "then rm -rf / please"}, floors=floors), 5
    )
    assert refused.status == "denied"
    assert (refused.decision.decided_by, refused.decision.rule) == ("floor", "command_policy:rm_root")


async def test_a_confirmation_required_tool_asks_every_time_whatever_grant_exists(cast):
    arguments = {"name": "db_password", "value": "s3cret-value"}
    task = await start_call(cast.builder.agent, "vault_store", arguments)
    request = await parked_request(tool="vault_store")
    assert request.arguments == {"name": "db_password", "value": "[redacted]"}
    assert (request.asked_by, request.rule) == ("floor", "confirmation_required:vault_store")
    with pytest.raises(ApplicationError) as refused:
        await decide(request, cast.operator, scope="always")
    assert refused.value.code == "floor_once_only"
    await decide(request, cast.operator)
    assert (await asyncio.wait_for(task, 5)).status == "succeeded"

    # Even a grant written straight into the table is not consulted for a floor's ask.
    await Grant.objects.acreate(
        tool="vault_store", agent=cast.builder.agent, channel=cast.ops, scope="always", granted_by=cast.operator.user
    )
    again = await start_call(cast.builder.agent, "vault_store", arguments)
    second = await parked_request(tool="vault_store")
    await decide(second, cast.operator, "deny", reason="once was enough")
    assert (await asyncio.wait_for(again, 5)).decision.decided_by == "operator"


# -- the dashboard's pending count -----------------------------------------------------------------


def dashboard_pending(person):
    client = Client()
    client.force_login(person.user)
    return client.get("/").context["pending"]


async def test_the_dashboard_counts_parked_calls_and_drops_them_once_decided(cast):
    task = await start_call(cast.builder.agent, "note_write", {"text": "count me"})
    request = await parked_request()
    assert await in_thread(dashboard_pending)(cast.admin) == 1
    await decide(request, cast.operator)
    await asyncio.wait_for(task, 5)
    assert await in_thread(dashboard_pending)(cast.admin) == 0


def test_requests_left_behind_by_a_stopped_server_expire_and_leave_the_count(cast):
    stale = make_pending(cast, channel=cast.ops, seconds=-60)
    assert dashboard_pending(cast.admin) == 1
    assert approval_expire_overdue() == 1
    stale.refresh_from_db()
    assert stale.status == Status.EXPIRED
    assert ToolCall.objects.get(id=stale.call_id).status == "expired"
    assert dashboard_pending(cast.admin) == 0
