"""The chokepoint's Recorder: which finished calls become which signed entries."""

from __future__ import annotations

from tools_app.models import CallStatus, Channel, ToolCall

from .entries import arguments_sha256
from .services import Event, ledger_append

DECIDED_BY_PEOPLE = ("operator", "grant")
RAN = (CallStatus.SUCCEEDED, CallStatus.FAILED)
REFUSED = (CallStatus.DENIED, CallStatus.EXPIRED)


def call_events(call: ToolCall, *, mutating: bool, channel: str) -> list[Event]:
    """Every approval decision and refusal; a call that ran only when mutating (reads stay in the event log)."""
    args, encoding = arguments_sha256(call.input)
    common = {"tool": call.tool, "args_sha256": args, "call": str(call.id), "principal": call.principal or None}
    decision = {"channel": channel, "decided_by": call.decided_by, "rule": call.rule}
    if encoding != "rfc8785":
        decision["args_encoding"] = encoding
    events = []
    if call.decided_by in DECIDED_BY_PEOPLE:
        granted = call.status in RAN
        events.append(
            Event(
                action="approval_granted" if granted else "approval_denied",
                outcome="ok" if granted else "denied",
                detail={**decision, "reason": call.reason, "approval": call.approval or None},
                **common,
            )
        )
    if call.status in REFUSED and call.decided_by not in DECIDED_BY_PEOPLE:
        events.append(
            Event(
                action="tool_denied",
                outcome="denied",
                detail={**decision, "status": call.status, "reason": call.reason},
                **common,
            )
        )
    elif call.status in RAN and mutating:
        result = {"status": call.status, "duration_ms": call.duration_ms}
        if call.error:
            result["error"] = {"code": call.error.get("code"), "message": call.error.get("message")}
        events.append(
            Event(
                action="tool_call",
                outcome="ok" if call.status == CallStatus.SUCCEEDED else "error",
                detail={**decision, **result},
                **common,
            )
        )
    return events


def signs(call: ToolCall, *, mutating: bool) -> bool:
    """Whether `call_events` gives this call any entry, without building them (no hashing of the arguments)."""
    if call.status not in RAN and call.status not in REFUSED:
        return False
    return call.decided_by in DECIDED_BY_PEOPLE or call.status in REFUSED or mutating


class LedgerRecorder:
    """Appends inside the transaction that writes the finished call: both land, or neither does."""

    def records(self, call: ToolCall, *, mutating: bool) -> bool:
        return signs(call, mutating=mutating)

    def record(self, call: ToolCall, *, mutating: bool) -> None:
        if not signs(call, mutating=mutating):
            # Most calls are reads that ran: nothing to sign, so no query for the channel's name either.
            return
        channel = Channel.objects.filter(id=call.channel_id).values_list("name", flat=True).first() or ""
        for event in call_events(call, mutating=mutating, channel=channel):
            ledger_append(agent_id=call.agent_id, event=event)
