"""Aleph as an MCP server: tools/list is the agent's GET tools/, tools/call goes through the chokepoint."""

from __future__ import annotations

import asyncio
import json
import logging
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, CallToolResult, ListToolsResult, TextContent, Tool

from ..chokepoint.policy import is_hidden
from ..chokepoint.service import CallOutcome, CallRejected, ScopedToolService, canonical_json
from ..gateway import build_request_tool_service, gateway
from ..models import CallStatus
from ..policy_store import current_policy, policy_last
from ..services import token_hash
from .wiring import mcp_start

logger = logging.getLogger(__name__)

INSTRUCTIONS = (
    "Aleph Gateway: every tool here runs through Aleph's policy chokepoint. A call may be denied, or may wait for "
    "an operator's approval; a refusal explains which rule decided and why."
)


@dataclass(frozen=True)
class Principal:
    """Who is calling through MCP, and from which channel: fixed per HTTP request or per stdio process."""

    agent_id: int
    agent_name: str
    channel: str
    session_key: str | None = None


principal_var: ContextVar[Principal | None] = ContextVar("aleph_mcp_principal", default=None)
_running: set[asyncio.Task] = set()


def agent_for_token(token: str) -> tuple[int, str] | None:
    """The active agent a bearer token belongs to, from the compiled policy (the API's own lookup)."""
    policy = current_policy()
    agent_id = policy.agent_tokens.get(token_hash(token))
    if agent_id is None:
        return None
    return agent_id, policy.agents[agent_id].name


def _service(principal: Principal) -> ScopedToolService:
    return build_request_tool_service(
        policy=current_policy(),
        agent_id=principal.agent_id,
        channel_name=principal.channel,
        session_key=principal.session_key,
    )


def _principal() -> Principal:
    principal = principal_var.get()
    if principal is None:
        raise MCPError(INVALID_PARAMS, "No Aleph agent is bound to this connection.")
    return principal


async def tools_list(ctx: Any, params: Any) -> ListToolsResult:
    principal = _principal()
    try:
        service = await sync_to_async(_service)(principal)
    except CallRejected as exc:
        raise MCPError(INVALID_PARAMS, exc.message) from None
    return ListToolsResult(tools=[Tool.model_validate(entry) for entry in service.dispatcher_schema("mcp")])


def tool_input_schema(name: str) -> dict[str, Any] | None:
    """The schema the SDK checks a tools/call's Mcp-Param-* headers against, for a tool this caller may see.

    Without it the SDK runs tools/list on every HTTP tools/call to find that schema: a thread hop, a policy read and
    every tool's definition, ~40 ms a call. It runs on the event loop, so it reads the policy compiled last (the token
    check just compiled it); the call itself is decided by the chokepoint on the current policy.
    """
    principal = principal_var.get()
    policy = policy_last()
    if principal is None or policy is None:
        return None
    channel = policy.channels.get(principal.channel)
    tool = gateway().registry.get(name)
    if channel is None or tool is None or is_hidden(policy, name, principal.agent_id, channel.id):
        return None
    return tool.input_schema()


def _error(text: str, structured: dict[str, Any]) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured, is_error=True)


def outcome_result(outcome: CallOutcome) -> CallToolResult:
    """A finished call as the model reads it: the output on success, otherwise who decided what, and why."""
    payload = outcome.as_dict()
    decision = outcome.decision
    result = outcome.result
    if outcome.status == CallStatus.SUCCEEDED and result is not None:
        output = result.output
        text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, default=str)
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=payload)
    if outcome.status == CallStatus.FAILED and result is not None and result.error is not None:
        return _error(f"{outcome.tool} failed ({result.error.code}): {result.error.message}", payload)
    return _error(
        f"{outcome.tool} was {outcome.status} by {decision.decided_by} (rule {decision.rule}): {decision.reason}",
        payload,
    )


async def tools_call(ctx: Any, params: Any) -> CallToolResult:
    principal = _principal()
    arguments = params.arguments or {}
    if len(canonical_json(arguments)) > settings.ALEPH_MAX_INPUT_BYTES:
        message = f"The arguments are larger than {settings.ALEPH_MAX_INPUT_BYTES} bytes."
        return _error(message, {"error": {"code": "input_too_large", "message": message}})
    try:
        service = await sync_to_async(_service)(principal)
    except CallRejected as exc:
        return _error(exc.message, {"error": {"code": exc.code, "message": exc.message, "detail": exc.detail}})

    async def waiting(call_id: str) -> None:
        try:
            await ctx.session.report_progress(0, None, f"Call {call_id} is waiting for an operator's approval.")
        except Exception:  # a client that cannot take progress still gets its result
            logger.debug("progress notice for %s not delivered", call_id, exc_info=True)

    def on_park(call_id: str) -> None:
        _keep(asyncio.ensure_future(waiting(call_id)))

    # The call belongs to the chokepoint: a client that hangs up never leaves it half-recorded.
    task = asyncio.ensure_future(service.execute(params.name, arguments, on_park=on_park))
    _keep(task)
    try:
        outcome = await asyncio.shield(task)
    except CallRejected as exc:
        return _error(
            f"{exc.code}: {exc.message}", {"error": {"code": exc.code, "message": exc.message, "detail": exc.detail}}
        )
    return outcome_result(outcome)


def _keep(task: asyncio.Future) -> None:
    _running.add(task)
    task.add_done_callback(_running.discard)


def server_build() -> Server:
    return Server(
        "aleph-gateway",
        version=settings.SPECTACULAR_SETTINGS["VERSION"],
        instructions=INSTRUCTIONS,
        get_tool_input_schema=tool_input_schema,
        on_list_tools=tools_list,
        on_call_tool=tools_call,
    )


async def stdio_serve(*, agent_id: int, agent_name: str, channel: str, session_key: str | None) -> None:
    """`mcp_serve`: one agent in one channel over stdin/stdout, with its own MCP manager for bridged tools."""
    principal_var.set(Principal(agent_id=agent_id, agent_name=agent_name, channel=channel, session_key=session_key))
    wired = await sync_to_async(gateway)()
    manager = mcp_start(wired)
    if manager is not None:
        await manager.settled()
    server = server_build()
    try:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        if manager is not None:
            await manager.stop()
