"""The only door: ScopedToolService resolves, decides, asks, runs and records every tool call."""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from ..models import CallStatus, ToolCall
from .base import SELF_PROTECTED_TOOLS, BaseTool, ToolContext, ToolDefinition, ToolInputError, ToolResult
from .event_log import insert, insert_from_loop
from .policy import ASK, DENY, AgentInfo, ChannelInfo, CompiledPolicy, Decision, decide, is_hidden
from .registry import ToolRegistry

logger = logging.getLogger(__name__)


class CallRejected(Exception):
    """The request never became a call (unknown tool, bad arguments): nothing is recorded."""

    def __init__(self, code: str, message: str, detail: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail or {}


@dataclass(frozen=True)
class SessionInfo:
    id: int
    key: str
    exec_tier: str | None


@dataclass(frozen=True)
class Turn:
    """Who calls, from where: the four things a ScopedToolService is built from."""

    agent: AgentInfo
    channel: ChannelInfo
    session: SessionInfo | None
    attended: bool


@dataclass(frozen=True)
class PendingCall:
    """What the approval desk is told about a call waiting for a person."""

    call_id: str
    turn: Turn
    tool: str
    input: dict[str, Any]
    fingerprint: str
    decision: Decision


@dataclass(frozen=True)
class Settlement:
    """How an "ask" ended: approved or not, by whom, and why."""

    approved: bool
    decided_by: str
    reason: str
    approval: str | None = None
    principal: str | None = None
    expired: bool = False


class ApprovalGate(Protocol):
    async def standing_grant(self, pending: PendingCall) -> Settlement | None: ...

    async def request(self, pending: PendingCall) -> Settlement: ...


class Recorder(Protocol):
    def records(self, call: ToolCall, *, mutating: bool) -> bool:
        """Whether `record` writes anything for this finished call; when not, its event-log row needs no transaction."""

    def record(self, call: ToolCall, *, mutating: bool) -> None:
        """Called inside the transaction that writes the finished call to the event log."""


class CommandFloor(Protocol):
    def check(self, tool: BaseTool, args: Any, policy: CompiledPolicy) -> Decision | None: ...


class NoApprovalGate:
    """Until an approval desk is wired in, an "ask" is refused, never run."""

    async def standing_grant(self, pending: PendingCall) -> Settlement | None:
        return None

    async def request(self, pending: PendingCall) -> Settlement:
        return Settlement(
            approved=False,
            decided_by="floor",
            reason="No approval desk is configured, so a call that needs a person's approval is refused.",
        )


class NullRecorder:
    def records(self, call: ToolCall, *, mutating: bool) -> bool:
        return False

    def record(self, call: ToolCall, *, mutating: bool) -> None:
        return None


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def arguments_fingerprint(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


@dataclass(frozen=True)
class Ruling:
    """What the policy made of a call before anyone is asked: the decision and the parsed arguments."""

    decision: Decision
    args: Any
    mutating: bool


@dataclass
class CallOutcome:
    id: str
    tool: str
    status: str
    decision: Decision
    result: ToolResult | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tool": self.tool,
            "status": self.status,
            "decision": self.decision.as_dict(),
            "result": self.result.as_dict() if self.result else None,
        }


class ToolService(Protocol):
    async def execute(
        self, name: str, raw_input: dict[str, Any], on_park: Callable[[str], None] | None = None
    ) -> CallOutcome: ...

    def list(self) -> list[ToolDefinition]: ...

    def describe(self, name: str) -> ToolDefinition | None: ...

    def dispatcher_schema(self, format: str) -> list[dict[str, Any]]: ...


def dispatcher_entry(definition: ToolDefinition, format: str) -> dict[str, Any]:
    if format == "openai":
        return {
            "type": "function",
            "function": {
                "name": definition.name,
                "description": definition.description,
                "parameters": definition.input_schema,
            },
        }
    if format == "anthropic":
        return {"name": definition.name, "description": definition.description, "input_schema": definition.input_schema}
    if format == "mcp":
        facts = definition.facts
        annotations = {}
        if facts is not None:
            annotations = {
                "readOnlyHint": facts.idempotent and not facts.requires_approval,
                "idempotentHint": facts.idempotent,
                "destructiveHint": facts.requires_approval,
            }
        return {
            "name": definition.name,
            "description": definition.description,
            "inputSchema": definition.input_schema,
            "annotations": annotations,
        }
    raise ValueError(f"unknown dispatcher format {format!r}: use openai, anthropic or mcp")


DISPATCHER_FORMATS = ("openai", "anthropic", "mcp")


class NullToolService:
    """A service that knows no tools: every name is not found."""

    async def execute(
        self, name: str, raw_input: dict[str, Any], on_park: Callable[[str], None] | None = None
    ) -> CallOutcome:
        raise CallRejected("tool_not_found", f"No tool named {name!r} is available here.")

    def list(self) -> list[ToolDefinition]:
        return []

    def describe(self, name: str) -> ToolDefinition | None:
        return None

    def dispatcher_schema(self, format: str) -> list[dict[str, Any]]:
        return []


class ScopedToolService:
    """A ToolService bound to one turn (agent, channel, session, attended)."""

    def __init__(
        self,
        *,
        registry: ToolRegistry,
        policy: CompiledPolicy,
        turn: Turn,
        gate: ApprovalGate,
        recorder: Recorder,
        floors: tuple[CommandFloor, ...] = (),
    ):
        self.registry = registry
        self.policy = policy
        self.turn = turn
        self.gate = gate
        self.recorder = recorder
        self.floors = floors

    # -- what the model may see ------------------------------------------------------------

    def _visible(self, tool: BaseTool) -> bool:
        return not is_hidden(self.policy, tool.name, self.turn.agent.id, self.turn.channel.id)

    def list(self) -> list[ToolDefinition]:
        return [tool.definition() for tool in self.registry.all() if self._visible(tool)]

    def describe(self, name: str) -> ToolDefinition | None:
        tool = self.registry.get(name)
        if tool is None or not self._visible(tool):
            return None
        return tool.definition()

    def dispatcher_schema(self, format: str) -> list[dict[str, Any]]:
        return [dispatcher_entry(definition, format) for definition in self.list()]

    # -- deciding --------------------------------------------------------------------------

    def _floor(self, tool: BaseTool, args: Any) -> Decision | None:
        if tool.name in SELF_PROTECTED_TOOLS:
            return Decision(
                DENY,
                "floor",
                f"self_protection:{tool.name}",
                f"An agent can never change the settings that gate it; {tool.name} is for people only.",
            )
        for floor in self.floors:
            decision = floor.check(tool, args, self.policy)
            if decision is not None:
                return decision
        return None

    def _rule(self, tool: BaseTool, raw_input: dict[str, Any], trace: list[dict[str, Any]] | None = None) -> Ruling:
        """Steps 2-4 of a call: entries, tier and floors; a deny entry settles it before the arguments are read."""
        entry = self.policy.entry_for(tool.name, self.turn.agent.id, self.turn.channel.id)
        tier, tier_source = self.policy.tier_for(
            self.turn.agent.id, self.turn.channel, self.turn.session.exec_tier if self.turn.session else None
        )
        if trace is not None:
            trace.append(
                {
                    "step": "entry",
                    "result": entry.label if entry else None,
                    "note": entry.action if entry else "no entry",
                }
            )
            trace.append({"step": "tier", "result": tier, "note": tier_source})
        if entry is not None and entry.action == DENY:
            decision = decide(tool=tool.name, facts=None, entry=entry, tier=tier, tier_source=tier_source)
            return Ruling(decision, args=None, mutating=False)
        args = self._parse(tool, raw_input)
        facts = tool.facts_for(args)
        floor = self._floor(tool, args)
        if trace is not None:
            trace.append(
                {"step": "facts", "result": facts.as_dict() if facts else None, "note": "" if facts else "unknown"}
            )
            trace.append(
                {"step": "floor", "result": floor.rule if floor else None, "note": floor.reason if floor else ""}
            )
        decision = decide(tool=tool.name, facts=facts, entry=entry, tier=tier, tier_source=tier_source, floor=floor)
        return Ruling(decision, args=args, mutating=facts is None or not facts.idempotent)

    def explain(self, name: str, raw_input: dict[str, Any]) -> tuple[Decision, list[dict[str, Any]]]:
        """The decision the policy would take for this call and how it got there, without running or asking."""
        tool = self.registry.get(name)
        if tool is None:
            raise CallRejected("tool_not_found", f"No tool named {name!r} is registered.")
        trace: list[dict[str, Any]] = []
        decision = self._rule(tool, raw_input, trace).decision
        if decision.decided_by == "entry" and decision.verdict == DENY:
            return decision, trace
        trace.append({"step": "attended", "result": self.turn.attended, "note": self.turn.channel.name})
        if decision.verdict == ASK and not self.turn.attended:
            decision = decision.settled(decided_by="unattended", reason=self._unattended_reason(decision))
        return decision, trace

    def _unattended_reason(self, decision: Decision) -> str:
        return f"{decision.reason} Channel {self.turn.channel.name} is unattended: nobody can answer, so it is refused."

    @staticmethod
    def _parse(tool: BaseTool, raw_input: dict[str, Any]) -> Any:
        try:
            return tool.parse(raw_input)
        except ToolInputError as exc:
            raise CallRejected("invalid_arguments", str(exc), {"errors": exc.errors}) from None

    # -- the one door ----------------------------------------------------------------------

    async def execute(
        self, name: str, raw_input: dict[str, Any], on_park: Callable[[str], None] | None = None
    ) -> CallOutcome:
        tool = self.registry.get(name)
        if tool is None:
            raise CallRejected("tool_not_found", f"No tool named {name!r} is available here.")
        call = self._draft(name, tool.redact(raw_input))
        ruling = self._rule(tool, raw_input)
        decision, mutating = ruling.decision, ruling.mutating
        if decision.verdict == DENY:
            return await self._finish(call, decision, CallStatus.DENIED, None, mutating=mutating)
        if decision.verdict == ASK:
            settlement = await self._settle(call, decision, arguments_fingerprint(raw_input), on_park)
            decision = decision.settled(
                decided_by=settlement.decided_by,
                reason=settlement.reason,
                approval=settlement.approval,
                principal=settlement.principal,
            )
            if not settlement.approved:
                status = CallStatus.EXPIRED if settlement.expired else CallStatus.DENIED
                return await self._finish(call, decision, status, None, mutating=mutating)
        result = await tool.run(ruling.args, self._context(call))
        status = CallStatus.SUCCEEDED if result.success else CallStatus.FAILED
        return await self._finish(call, decision, status, result, mutating=mutating)

    async def _settle(
        self, call: ToolCall, decision: Decision, fingerprint: str, on_park: Callable[[str], None] | None
    ) -> Settlement:
        pending = PendingCall(
            call_id=str(call.id),
            turn=self.turn,
            tool=call.tool,
            input=call.input,
            fingerprint=fingerprint,
            decision=decision,
        )
        try:
            grant = await self.gate.standing_grant(pending)
        except Exception:
            return self._desk_failed()
        if grant is not None:
            return grant
        if not self.turn.attended:
            return Settlement(approved=False, decided_by="unattended", reason=self._unattended_reason(decision))
        await sync_to_async(self._park)(call, decision)
        if on_park is not None:
            on_park(str(call.id))
        try:
            return await self.gate.request(pending)
        except Exception:
            return self._desk_failed()

    @staticmethod
    def _desk_failed() -> Settlement:
        """A failing approval desk refuses the call: an answer nobody gave is never an approval."""
        logger.exception("the approval desk failed; the call is refused")
        return Settlement(
            approved=False, decided_by="floor", reason="The approval desk failed, so the call is refused; try again."
        )

    def _draft(self, name: str, raw_input: dict[str, Any]) -> ToolCall:
        return ToolCall(
            id=uuid.uuid4(),
            agent_id=self.turn.agent.id,
            channel_id=self.turn.channel.id,
            session_id=self.turn.session.id if self.turn.session else None,
            attended=self.turn.attended,
            tool=name,
            input=raw_input,
            created_at=timezone.now(),
        )

    def _context(self, call: ToolCall) -> ToolContext:
        return ToolContext(
            call_id=str(call.id),
            agent_id=self.turn.agent.id,
            agent_name=self.turn.agent.name,
            channel_name=self.turn.channel.name,
            session_key=self.turn.session.key if self.turn.session else None,
            attended=self.turn.attended,
        )

    @staticmethod
    def _apply(call: ToolCall, decision: Decision) -> None:
        call.verdict = decision.verdict
        call.decided_by = decision.decided_by
        call.rule = decision.rule
        call.reason = decision.reason
        call.approval = decision.approval or ""
        call.principal = decision.principal or ""

    def _park(self, call: ToolCall, decision: Decision) -> None:
        self._apply(call, decision)
        call.status = CallStatus.PENDING_APPROVAL
        call.save(force_insert=True)
        call._state.adding = False

    async def _finish(
        self, call: ToolCall, decision: Decision, status: str, result: ToolResult | None, *, mutating: bool
    ) -> CallOutcome:
        self._apply(call, decision)
        call.status = status
        call.finished_at = timezone.now()
        if result is not None:
            call.success = result.success
            call.output = result.output
            call.error = result.error.as_dict() if result.error else None
            call.duration_ms = result.duration_ms
        # Most calls are reads that ran: nothing to sign, and one INSERT is atomic on its own.
        alone = call._state.adding and not self.recorder.records(call, mutating=mutating)
        if not (alone and insert_from_loop(call)):
            await sync_to_async(self._write)(call, mutating, alone)
        return CallOutcome(str(call.id), call.tool, status, decision, result)

    def _write(self, call: ToolCall, mutating: bool, alone: bool) -> None:
        if alone:
            insert(call)
            return
        with transaction.atomic():
            if call._state.adding:
                insert(call)
            else:
                call.save(force_update=True)
            self.recorder.record(call, mutating=mutating)
