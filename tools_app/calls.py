"""Submitting a call and waiting for it: a call that parks for approval outlives the request that made it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from asgiref.sync import ThreadSensitiveContext

from .chokepoint.service import CallOutcome, ScopedToolService
from .models import FINISHED_STATUSES, ToolCall

_running: set[asyncio.Task] = set()
POLL_SECONDS = 0.2


def call_payload(call: ToolCall) -> dict[str, Any]:
    result = None
    if call.success is not None:
        result = {"success": call.success, "output": call.output, "error": call.error, "duration_ms": call.duration_ms}
    return {
        "id": str(call.id),
        "tool": call.tool,
        "status": call.status,
        "decision": {
            "verdict": call.verdict,
            "decided_by": call.decided_by,
            "rule": call.rule,
            "reason": call.reason,
            "approval": call.approval or None,
        },
        "result": result,
    }


async def _detached(service: ScopedToolService, tool: str, raw_input: dict[str, Any], on_park) -> CallOutcome:
    """Run the call in a thread context of its own: it may outlive the request, whose context closes at its end."""
    async with ThreadSensitiveContext():
        return await service.execute(tool, raw_input, on_park=on_park)


async def call_submit(
    *, service: ScopedToolService, tool: str, raw_input: dict[str, Any], wait: float
) -> tuple[dict[str, Any], bool]:
    """Run a call; return (payload, finished). A call still awaiting approval after `wait` seconds keeps going."""
    parked: list[str] = []
    parked_event = asyncio.Event()

    def on_park(call_id: str) -> None:
        parked.append(call_id)
        parked_event.set()

    task = asyncio.create_task(_detached(service, tool, raw_input, on_park))
    _running.add(task)
    task.add_done_callback(_running.discard)
    park_watch = asyncio.create_task(parked_event.wait())
    try:
        await asyncio.wait({task, park_watch}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            await asyncio.wait({task}, timeout=wait)
    finally:
        park_watch.cancel()
    if task.done():
        return task.result().as_dict(), True
    call = await ToolCall.objects.aget(id=parked[0])
    return call_payload(call), False


async def call_wait(*, call: ToolCall, wait: float) -> ToolCall:
    """Re-read the call until it finishes or `wait` seconds pass."""
    deadline = time.monotonic() + wait
    while call.status not in FINISHED_STATUSES and time.monotonic() < deadline:
        await asyncio.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        call = await ToolCall.objects.aget(id=call.id)
    return call
