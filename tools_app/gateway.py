"""The gateway the API asks for services: a registry and its collaborators, wired once by aleph_site."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from .chokepoint.policy import CompiledPolicy
from .chokepoint.registry import ToolRegistry
from .chokepoint.service import (
    ApprovalGate,
    CallRejected,
    CommandFloor,
    NoApprovalGate,
    NullRecorder,
    Recorder,
    ScopedToolService,
    SessionInfo,
    Turn,
)
from .services import session_open


@dataclass
class Gateway:
    registry: ToolRegistry
    gate: ApprovalGate = field(default_factory=NoApprovalGate)
    recorder: Recorder = field(default_factory=NullRecorder)
    floors: tuple[CommandFloor, ...] = ()
    health: dict[str, Any] = field(default_factory=dict)
    # Summaries other apps lend the dashboard (tools_app never imports them), e.g. "chains": the ledger's chain status.
    dashboard: dict[str, Callable[[], Any]] = field(default_factory=dict)


@functools.cache
def gateway() -> Gateway:
    """Built once per process by the factory named in settings.ALEPH_GATEWAY_FACTORY."""
    return import_string(settings.ALEPH_GATEWAY_FACTORY)()


def turn_build(
    *, policy: CompiledPolicy, agent_id: int, channel_name: str, session_key: str | None, attended: bool | None = None
) -> Turn:
    agent = policy.agents.get(agent_id)
    if agent is None or not agent.is_active:
        raise CallRejected("agent_inactive", "This agent is not active.")
    channel = policy.channels.get(channel_name)
    if channel is None:
        raise CallRejected("channel_not_found", f"No channel named {channel_name!r}.")
    session = None
    if session_key:
        row = session_open(agent_id=agent_id, key=session_key)
        session = SessionInfo(row.id, row.key, row.exec_tier)
    return Turn(
        agent=agent, channel=channel, session=session, attended=not channel.unattended if attended is None else attended
    )


def build_request_tool_service(
    *,
    policy: CompiledPolicy,
    agent_id: int,
    channel_name: str,
    session_key: str | None = None,
    attended: bool | None = None,
) -> ScopedToolService:
    """The one builder of ScopedToolService: per request, from (agent, channel, session, attended)."""
    turn = turn_build(
        policy=policy, agent_id=agent_id, channel_name=channel_name, session_key=session_key, attended=attended
    )
    wired = gateway()
    return ScopedToolService(
        registry=wired.registry, policy=policy, turn=turn, gate=wired.gate, recorder=wired.recorder, floors=wired.floors
    )
