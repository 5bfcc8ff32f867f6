"""Shared helpers for the approvals suites: run calls through the real chokepoint and find what they parked."""

import asyncio
import gc
import time
from datetime import timedelta

import pytest
from asgiref.sync import SyncToAsync, sync_to_async
from channels.db import database_sync_to_async
from django.db import connections
from django.utils import timezone

from approvals_app.models import ApprovalRequest, Status
from tools_app.chokepoint.service import ScopedToolService, arguments_fingerprint
from tools_app.gateway import build_request_tool_service, gateway, turn_build
from tools_app.models import CallStatus, ToolCall
from tools_app.policy_store import current_policy


@pytest.fixture(autouse=True)
def _close_worker_connections():
    """Worker threads keep their database connections; close them so PostgreSQL can drop the test database."""
    yield
    SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=10)
    gc.collect()


def in_thread(function):
    """Run ORM code on a worker thread of its own, as concurrent requests would."""
    return database_sync_to_async(function, thread_sensitive=False)


@sync_to_async
def service_for(agent, channel="ops", session=None, floors=None):
    policy = current_policy()
    if floors is None:
        return build_request_tool_service(policy=policy, agent_id=agent.id, channel_name=channel, session_key=session)
    wired = gateway()
    turn = turn_build(policy=policy, agent_id=agent.id, channel_name=channel, session_key=session)
    return ScopedToolService(
        registry=wired.registry, policy=policy, turn=turn, gate=wired.gate, recorder=wired.recorder, floors=floors
    )


async def start_call(agent, tool, arguments, channel="ops", session=None, floors=None):
    service = await service_for(agent, channel, session, floors)
    return asyncio.ensure_future(service.execute(tool, arguments))


async def parked_request(timeout=5.0, **filters):
    """The newest pending request matching `filters`, once its call has parked."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = await sync_to_async(
            lambda: (
                ApprovalRequest.objects.filter(status=Status.PENDING, **filters)
                .select_related("agent", "channel", "session", "call")
                .order_by("-created_at")
                .first()
            )
        )()
        if found is not None:
            return found
        await asyncio.sleep(0.02)
    raise AssertionError(f"no pending approval request matching {filters} within {timeout}s")


def make_pending(cast, *, channel, tool="note_write", arguments=None, session=None, seconds=120, asked_by="tier"):
    """A parked call and its request written directly, for API and page tests that need no live waiter."""
    arguments = arguments if arguments is not None else {"text": "hello"}
    now = timezone.now()
    call = ToolCall.objects.create(
        agent=cast.builder.agent,
        channel=channel,
        session=session,
        tool=tool,
        input=arguments,
        status=CallStatus.PENDING_APPROVAL,
        verdict="ask",
        decided_by=asked_by,
        rule="tier:ask",
        reason="The Ask tier asks before any call that changes something.",
        created_at=now,
    )
    return ApprovalRequest.objects.create(
        call=call,
        agent=cast.builder.agent,
        channel=channel,
        session=session,
        tool=tool,
        arguments=arguments,
        fingerprint=arguments_fingerprint(arguments),
        asked_by=asked_by,
        rule="tier:ask",
        reason="The Ask tier asks before any call that changes something.",
        created_at=now,
        deadline=now + timedelta(seconds=seconds),
    )
