"""Approval services: open a request, decide it (first decision wins), expire it, and keep grants."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from fnmatch import fnmatchcase
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from tools_app.chokepoint.service import PendingCall, Settlement
from tools_app.models import CallStatus, ToolCall
from tools_app.services import ApplicationError, person_roles

from .models import ApprovalRequest, DecisionScope, Grant, Status

logger = logging.getLogger(__name__)

CARDS_GROUP = "approvals.cards"
WAKE_GROUP = "approvals.wake"
DECISIONS = ("approve", "deny")
MATCHES = ("arguments", "tool")
# A waiter expires its own request at the deadline; past this grace nobody is waiting any more.
OVERDUE_GRACE = timedelta(seconds=30)
MAX_GRANT_SPAN = timedelta(days=366)


# -- who may decide -----------------------------------------------------------------------------


def deciders_of(*, channel_id: int) -> frozenset[int]:
    """The people who may decide this channel's cards now: active admins, and active operators it names."""
    User = get_user_model()
    allowed = User.objects.filter(is_active=True).filter(
        Q(is_superuser=True) | Q(groups__name="operator", operated_channels__id=channel_id)
    )
    return frozenset(allowed.values_list("id", flat=True).distinct())


def may_decide(*, person, channel_id: int) -> bool:
    return person is not None and getattr(person, "pk", None) in deciders_of(channel_id=channel_id)


def approval_visible(*, person) -> QuerySet[ApprovalRequest]:
    """The requests a person may see and decide: admins all, operators their channels', anyone else none."""
    requests = ApprovalRequest.objects.select_related("agent", "channel", "session", "decided_by")
    roles = person_roles(person)
    if "admin" in roles:
        return requests
    if "operator" in roles:
        return requests.filter(channel__operators=person)
    return requests.none()


def approval_list(*, person, status: str | None = None, limit: int = 200) -> list[ApprovalRequest]:
    """What a person may decide or review, newest first; overdue requests of stopped servers are expired first."""
    approval_expire_overdue()
    requests = approval_visible(person=person)
    if status:
        requests = requests.filter(status=status)
    return list(requests[:limit])


def approval_find(*, person, request_id) -> ApprovalRequest:
    """One request, or 404 when it does not exist or this person may not see it (the same answer for both)."""
    request = approval_visible(person=person).filter(pk=request_id).first()
    if request is None:
        raise ApplicationError("No such approval request for you.", code="not_found", status=404)
    return request


def grants_visible(*, person) -> QuerySet[Grant]:
    grants = Grant.objects.select_related("agent", "channel", "session", "granted_by", "revoked_by")
    roles = person_roles(person)
    if "admin" in roles:
        return grants
    if "operator" in roles:
        return grants.filter(channel__operators=person)
    return grants.none()


# -- what a card shows --------------------------------------------------------------------------


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def _card(request: ApprovalRequest, *, agent: str, channel: str, session: str | None, decider: str | None) -> dict:
    return {
        "id": str(request.id),
        "call": str(request.call_id),
        "agent": agent,
        "channel": channel,
        "session": session,
        "tool": request.tool,
        "arguments": request.arguments,
        "fingerprint": request.fingerprint,
        "asked_by": request.asked_by,
        "rule": request.rule,
        "reason": request.reason,
        "status": request.status,
        "created_at": _iso(request.created_at),
        "deadline": _iso(request.deadline),
        "decided_by": decider,
        "decided_at": _iso(request.decided_at),
        "scope": request.scope or None,
        "decision_reason": request.decision_reason,
        "until": _iso(request.until),
    }


def approval_card(request: ApprovalRequest) -> dict[str, Any]:
    """Everything a person needs to decide, on one card."""
    return _card(
        request,
        agent=request.agent.name,
        channel=request.channel.name,
        session=request.session.key if request.session_id else None,
        decider=request.decided_by.get_username() if request.decided_by_id else None,
    )


def _resolution(request: ApprovalRequest, decider: str | None) -> dict[str, Any]:
    return {
        "id": str(request.id),
        "status": request.status,
        "decided_by": decider,
        "decided_at": _iso(request.decided_at),
        "scope": request.scope or None,
        "reason": request.decision_reason,
    }


# -- telling people and waking waiters ----------------------------------------------------------


def _broadcast(messages: list[tuple[str, dict[str, Any]]]) -> None:
    """Best effort: the database already holds the truth, and waiters re-read it on their own."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        for group, message in messages:
            async_to_sync(layer.group_send)(group, message)
    except Exception:
        logger.exception("approvals: a channel-layer notification failed; waiters fall back to polling")


def _event(kind: str, request: ApprovalRequest, body: dict[str, Any]) -> dict[str, Any]:
    """`payload` is what a socket receives; `audience` who may receive it, read from the database for this event."""
    return {
        "type": kind,
        "audience": sorted(deciders_of(channel_id=request.channel_id)),
        "payload": {"type": kind, **body},
    }


def _announce_outcome(request: ApprovalRequest, decider: str | None) -> None:
    kind = "approval.expired" if request.status == Status.EXPIRED else "approval.resolved"
    message = _event(kind, request, {"resolution": _resolution(request, decider)})
    wake = {"type": "approval.wake", "id": str(request.id)}
    transaction.on_commit(lambda: _broadcast([(WAKE_GROUP, wake), (CARDS_GROUP, message)]))


# -- the request's life -------------------------------------------------------------------------


@transaction.atomic
def approval_open(
    *, pending: PendingCall, approval_id: uuid.UUID, arguments: dict[str, Any], timeout_s: int
) -> ApprovalRequest:
    """Create the request for a parked call and show its card to the channel's operators."""
    # Opening a request is also when the requests of servers that stopped are swept.
    approval_expire_overdue()
    turn = pending.turn
    now = timezone.now()
    request = ApprovalRequest.objects.create(
        id=approval_id,
        call_id=pending.call_id,
        agent_id=turn.agent.id,
        channel_id=turn.channel.id,
        session_id=turn.session.id if turn.session else None,
        tool=pending.tool,
        arguments=arguments,
        fingerprint=pending.fingerprint,
        asked_by=pending.decision.decided_by,
        rule=pending.decision.rule,
        reason=pending.decision.reason,
        created_at=now,
        deadline=now + timedelta(seconds=timeout_s),
    )
    # Built from the turn, so opening a request costs no extra reads.
    card = _card(
        request,
        agent=turn.agent.name,
        channel=turn.channel.name,
        session=turn.session.key if turn.session else None,
        decider=None,
    )
    message = _event("approval.requested", request, {"request": card})
    transaction.on_commit(lambda: _broadcast([(CARDS_GROUP, message)]))
    return request


def _validate_decision(
    *, request: ApprovalRequest, decision: str, scope: str, until: datetime | None, match: str, now: datetime
) -> None:
    if decision not in DECISIONS:
        raise ApplicationError("decision must be approve or deny", code="invalid_decision")
    if scope not in DecisionScope.values:
        raise ApplicationError("scope must be once, session, always or until", code="invalid_scope")
    if match not in MATCHES:
        raise ApplicationError("match must be arguments or tool", code="invalid_match")
    if decision == "deny" and scope != DecisionScope.ONCE:
        raise ApplicationError(
            "A denial is for this call only; to refuse a tool for good an admin writes a deny entry.",
            code="invalid_scope",
        )
    if scope == DecisionScope.SESSION and request.session_id is None:
        raise ApplicationError("This call belongs to no session, so it cannot be approved for one.", code="no_session")
    if scope == DecisionScope.UNTIL and until is None:
        raise ApplicationError("scope until needs an `until` time.", code="invalid_until")
    if scope != DecisionScope.UNTIL and until is not None:
        raise ApplicationError("`until` goes with scope until only.", code="invalid_until")
    if until is not None and not now < until <= now + MAX_GRANT_SPAN:
        raise ApplicationError("`until` must lie in the future, within a year.", code="invalid_until")
    if scope != DecisionScope.ONCE and request.asked_by == "floor":
        raise ApplicationError(
            f"{request.tool} always needs a person's confirmation ({request.rule}): approve it once or deny it.",
            code="floor_once_only",
        )


def _refusal(request: ApprovalRequest) -> ApplicationError:
    fresh = ApprovalRequest.objects.select_related("decided_by").get(pk=request.pk)
    if fresh.status == Status.PENDING or fresh.status == Status.EXPIRED:
        return ApplicationError(
            "Too late: nobody decided before the deadline, so the call was refused.",
            code="expired",
            status=409,
            detail={"status": Status.EXPIRED.value},
        )
    if fresh.status == Status.CANCELLED:
        return ApplicationError(
            "The call went away before a decision.", code="cancelled", status=409, detail={"status": fresh.status}
        )
    who = fresh.decided_by.get_username() if fresh.decided_by_id else "someone"
    return ApplicationError(
        f"Already decided by {who} ({fresh.status}).",
        code="already_decided",
        status=409,
        detail={"status": fresh.status, "decided_by": who},
    )


@transaction.atomic
def approval_decide(
    *,
    request: ApprovalRequest,
    operator,
    decision: str,
    scope: str = DecisionScope.ONCE,
    reason: str = "",
    until: datetime | None = None,
    match: str = "arguments",
) -> ApprovalRequest:
    """The first decision wins by a conditional update; any later one is refused with who decided."""
    if not may_decide(person=operator, channel_id=request.channel_id):
        raise ApplicationError("You may not decide this channel's approvals.", code="permission_denied", status=403)
    now = timezone.now()
    _validate_decision(request=request, decision=decision, scope=scope, until=until, match=match, now=now)
    status = Status.APPROVED if decision == "approve" else Status.DENIED
    won = ApprovalRequest.objects.filter(pk=request.pk, status=Status.PENDING, deadline__gt=now).update(
        status=status,
        decided_by=operator,
        decided_at=now,
        scope=scope,
        decision_reason=reason.strip(),
        until=until,
    )
    if not won:
        raise _refusal(request)
    request = ApprovalRequest.objects.select_related("agent", "channel", "session", "decided_by").get(pk=request.pk)
    if status == Status.APPROVED and scope != DecisionScope.ONCE:
        Grant.objects.create(
            tool=request.tool,
            fingerprint=request.fingerprint if match == "arguments" else "",
            agent_id=request.agent_id,
            channel_id=request.channel_id,
            session_id=request.session_id if scope == DecisionScope.SESSION else None,
            scope=scope,
            granted_by=operator,
            source=request,
            expires_at=until,
        )
    if status == Status.APPROVED:
        # Out of the pending count at once; the chokepoint writes every finished state (and the ledger) itself.
        ToolCall.objects.filter(id=request.call_id, status=CallStatus.PENDING_APPROVAL).update(
            status=CallStatus.RUNNING
        )
    _announce_outcome(request, operator.get_username())
    return request


def _expire_call(call_id, now: datetime, reason: str) -> None:
    ToolCall.objects.filter(id=call_id, status=CallStatus.PENDING_APPROVAL).update(
        status=CallStatus.EXPIRED, decided_by="timeout", reason=reason, finished_at=now
    )


@transaction.atomic
def approval_expire(*, request: ApprovalRequest, waiter_gone: bool = False) -> ApprovalRequest:
    """At the deadline: expire the request unless a decision got in first, and return how it ended.
    A live waiter's chokepoint finishes the call itself; a call whose waiter is gone is finished here."""
    now = timezone.now()
    expired = ApprovalRequest.objects.filter(pk=request.pk, status=Status.PENDING).update(
        status=Status.EXPIRED, decided_at=now, decision_reason="Nobody decided before the deadline."
    )
    request = ApprovalRequest.objects.select_related("channel", "decided_by").get(pk=request.pk)
    if expired:
        if waiter_gone:
            _expire_call(request.call_id, now, timeout_reason(request.channel.approval_timeout_s))
        _announce_outcome(request, None)
    return request


@transaction.atomic
def approval_cancel(*, request_id: uuid.UUID) -> None:
    """The waiting call went away (its server stopped): the card must not stay answerable."""
    now = timezone.now()
    cancelled = ApprovalRequest.objects.filter(pk=request_id, status=Status.PENDING).update(
        status=Status.CANCELLED, decided_at=now, decision_reason="The call stopped waiting."
    )
    if cancelled:
        request = ApprovalRequest.objects.get(pk=request_id)
        _expire_call(request.call_id, now, "The server stopped while the call awaited approval.")
        _announce_outcome(request, None)


def approval_expire_overdue() -> int:
    """Expire requests whose waiter is gone (a server that stopped): they would otherwise stay pending forever."""
    now = timezone.now()
    overdue = list(
        ApprovalRequest.objects.filter(status=Status.PENDING, deadline__lt=now - OVERDUE_GRACE).values_list(
            "id", flat=True
        )
    )
    for request_id in overdue:
        approval_expire(request=ApprovalRequest(pk=request_id), waiter_gone=True)
    return len(overdue)


def approval_read(*, request_id: uuid.UUID) -> ApprovalRequest:
    return ApprovalRequest.objects.select_related("channel", "decided_by").get(pk=request_id)


def approvals_settled(*, ids: list[str]) -> list[str]:
    """Of these requests, the ones no longer pending: one query however many calls wait in this process."""
    settled = ApprovalRequest.objects.filter(id__in=ids).exclude(status=Status.PENDING).values_list("id", flat=True)
    return [str(request_id) for request_id in settled]


def timeout_reason(timeout_s: int) -> str:
    return (
        f"Nobody approved this call within {timeout_s} s, so it was refused as timed out. "
        "It did not run; try again when an operator is available, or choose another way."
    )


def approval_settlement(request: ApprovalRequest) -> Settlement:
    """How the chokepoint hears the outcome: the operator's name and reason, or the timeout."""
    if request.status == Status.APPROVED:
        scope = DecisionScope(request.scope).label.lower()
        note = f": {request.decision_reason}" if request.decision_reason else "."
        who = request.decided_by.get_username()
        return Settlement(
            approved=True,
            decided_by="operator",
            reason=f"Approved by {who} ({scope}){note}",
            approval=str(request.id),
            principal=who,
        )
    if request.status == Status.DENIED:
        who = request.decided_by.get_username()
        why = request.decision_reason or "no reason given"
        return Settlement(
            approved=False,
            decided_by="operator",
            reason=f"Denied by {who}: {why}",
            approval=str(request.id),
            principal=who,
        )
    return Settlement(
        approved=False,
        decided_by="timeout",
        reason=timeout_reason(request.channel.approval_timeout_s),
        approval=str(request.id),
        expired=True,
    )


# -- standing grants ----------------------------------------------------------------------------


def grant_find(*, agent_id: int, channel_id: int, session_id: int | None, tool: str, fingerprint: str) -> Grant | None:
    """The standing grant that covers this call now, counted as used; revoked or expired ones never do."""
    now = timezone.now()
    candidates = (
        Grant.objects.select_related("granted_by")
        .filter(agent_id=agent_id, channel_id=channel_id, revoked_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .filter(Q(fingerprint="") | Q(fingerprint=fingerprint))
        .filter(Q(session__isnull=True) | Q(session_id=session_id))
        .order_by("created_at")
    )
    for grant in candidates:
        if not fnmatchcase(tool, grant.tool):
            continue
        used = Grant.objects.filter(pk=grant.pk, revoked_at__isnull=True).update(uses=F("uses") + 1, last_used_at=now)
        if used:
            return grant
    return None


def grant_settlement(grant: Grant) -> Settlement:
    who = grant.granted_by.get_username()
    span = {
        DecisionScope.SESSION: "for this session",
        DecisionScope.ALWAYS: "always",
        DecisionScope.UNTIL: f"until {_iso(grant.expires_at)}",
    }[grant.scope]
    subject = "these arguments" if grant.fingerprint else "any arguments"
    return Settlement(
        approved=True,
        decided_by="grant",
        reason=f"A standing grant by {who} allows {grant.tool} with {subject} {span}.",
        approval=f"grant:{grant.id}",
        principal=who,
    )


@transaction.atomic
def grant_revoke(*, grant: Grant, person) -> Grant:
    """Revoked grants stop at once: every later call reads the grant afresh."""
    if not may_decide(person=person, channel_id=grant.channel_id):
        raise ApplicationError("You may not revoke this channel's grants.", code="permission_denied", status=403)
    now = timezone.now()
    Grant.objects.filter(pk=grant.pk, revoked_at__isnull=True).update(revoked_at=now, revoked_by=person)
    return Grant.objects.get(pk=grant.pk)
