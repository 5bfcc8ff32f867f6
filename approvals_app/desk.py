"""The approval desk the chokepoint awaits: a standing grant, else a person's decision, else the deadline."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import uuid
import weakref
from typing import Any

from channels.db import database_sync_to_async
from django.utils import timezone

from tools_app.chokepoint.registry import ToolRegistry
from tools_app.chokepoint.service import PendingCall, Settlement

from .listening import GroupListener
from .models import ApprovalRequest, Status
from .services import (
    WAKE_GROUP,
    approval_cancel,
    approval_expire,
    approval_open,
    approval_read,
    approval_settlement,
    approvals_settled,
    grant_find,
    grant_settlement,
)

logger = logging.getLogger(__name__)
IDLE_LINGER_S = 30.0


def _db(function):
    """`function` in a worker thread. Not thread-sensitive: a parked call outlives the request that made it, and so
    does its thread context. asgiref cannot stop a sync function once it runs, so a cancellation that lands meanwhile
    is swallowed and the result returned; it is raised here instead, once the function is done, so a call whose
    caller went away stops waiting (and cancels its card) rather than waiting out the deadline."""
    run = database_sync_to_async(function, thread_sensitive=False)

    @functools.wraps(function)
    async def call(*args: Any, **kwargs: Any) -> Any:
        result = await run(*args, **kwargs)
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
        return result

    return call


class _Waiters:
    """The calls waiting in one event loop: one wake-up subscription and one database poll, however many wait."""

    def __init__(self, poll_seconds: float):
        self.poll_seconds = poll_seconds
        self.futures: dict[str, asyncio.Future] = {}
        self._wakeups = GroupListener(WAKE_GROUP, self._on_wake)
        self._poller: asyncio.Task | None = None
        self._idle_timer: asyncio.TimerHandle | None = None

    async def add(self, key: str) -> None:
        loop = asyncio.get_running_loop()
        self.futures[key] = loop.create_future()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._poller is None:
            self._poller = loop.create_task(self._poll(), context=contextvars.Context())
        # Subscribed before the request exists, so no decision can slip past; a slow layer only costs the poll.
        await self._wakeups.start()

    def remove(self, key: str) -> None:
        self.futures.pop(key, None)
        if not self.futures and self._idle_timer is None:
            # Kept a while after the last waiter, so a busy server does not subscribe and unsubscribe per call.
            self._idle_timer = asyncio.get_running_loop().call_later(IDLE_LINGER_S, self._stop_if_idle)

    def _stop_if_idle(self) -> None:
        self._idle_timer = None
        if self.futures:
            return
        self._wakeups.stop()
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None

    def wake(self, key: Any) -> None:
        future = self.futures.get(key)
        if future is not None and not future.done():
            future.set_result(None)

    def reset(self, key: str) -> None:
        self.futures[key] = asyncio.get_running_loop().create_future()

    async def _on_wake(self, message: dict[str, Any]) -> None:
        self.wake(message.get("id"))

    async def _poll(self) -> None:
        """The database is the source of truth: a lost wake-up costs one poll interval, never the call."""
        while True:
            await asyncio.sleep(self.poll_seconds)
            keys = list(self.futures)
            if not keys:
                continue
            try:
                settled = await _db(approvals_settled)(ids=keys)
            except Exception:
                logger.exception("approvals: polling the database failed; trying again")
                continue
            for key in settled:
                self.wake(key)


class ApprovalDesk:
    """The ApprovalGate: consults standing grants, opens requests and waits for the first decision."""

    def __init__(self, *, registry: ToolRegistry | None = None, poll_seconds: float = 1.5):
        self.registry = registry
        self.poll_seconds = poll_seconds
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Waiters] = weakref.WeakKeyDictionary()

    def _waiters(self) -> _Waiters:
        loop = asyncio.get_running_loop()
        waiters = self._loops.get(loop)
        if waiters is None:
            waiters = self._loops[loop] = _Waiters(self.poll_seconds)
        return waiters

    def _shown(self, pending: PendingCall) -> dict[str, Any]:
        """The arguments as the card may show them: a tool's secret arguments are redacted."""
        tool = self.registry.get(pending.tool) if self.registry is not None else None
        return tool.redact(pending.input) if tool is not None else pending.input

    async def standing_grant(self, pending: PendingCall) -> Settlement | None:
        # A confirmation-required tool asks every time: no grant stands in for that person.
        if pending.decision.decided_by == "floor":
            return None
        turn = pending.turn
        grant = await _db(grant_find)(
            agent_id=turn.agent.id,
            channel_id=turn.channel.id,
            session_id=turn.session.id if turn.session else None,
            tool=pending.tool,
            fingerprint=pending.fingerprint,
        )
        return grant_settlement(grant) if grant is not None else None

    async def request(self, pending: PendingCall) -> Settlement:
        waiters = self._waiters()
        approval_id = uuid.uuid4()
        key = str(approval_id)
        await waiters.add(key)
        try:
            request = await _db(approval_open)(
                pending=pending,
                approval_id=approval_id,
                arguments=self._shown(pending),
                timeout_s=pending.turn.channel.approval_timeout_s,
            )
            request = await self._outcome(request, waiters, key)
        except asyncio.CancelledError:
            await _db(approval_cancel)(request_id=approval_id)
            raise
        finally:
            waiters.remove(key)
        return approval_settlement(request)

    async def _outcome(self, request: ApprovalRequest, waiters: _Waiters, key: str) -> ApprovalRequest:
        while True:
            remaining = (request.deadline - timezone.now()).total_seconds()
            if remaining <= 0:
                return await _db(approval_expire)(request=request)
            future = waiters.futures[key]
            if not future.done():
                try:
                    await asyncio.wait_for(asyncio.shield(future), timeout=remaining)
                except TimeoutError:
                    continue
            # A fresh future before reading, so a wake-up that lands during the read is not lost.
            waiters.reset(key)
            current = await _db(approval_read)(request_id=request.id)
            if current.status != Status.PENDING:
                return current
