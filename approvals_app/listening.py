"""One channel-layer subscription per event loop, shared by everything in the process that listens to a group."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)
SUBSCRIBE_TIMEOUT = 2.0


class GroupListener:
    """Hands each message sent to `group` to `handle`, from start() until stop()."""

    def __init__(self, group: str, handle: Callable[[dict[str, Any]], Awaitable[None]]):
        self.group = group
        self.handle = handle
        self._task: asyncio.Task | None = None
        self._ready: asyncio.Future | None = None

    async def start(self) -> None:
        """Returns once subscribed (or after a bounded wait when the layer is slow or down)."""
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._ready = loop.create_future()
            # A fresh context: the listener outlives the request or socket that started it.
            self._task = loop.create_task(self._listen(self._ready), context=contextvars.Context())
        with suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._ready), SUBSCRIBE_TIMEOUT)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _listen(self, ready: asyncio.Future) -> None:
        layer = get_channel_layer()
        channel = None
        try:
            if layer is not None:
                channel = await layer.new_channel("approvals.listener.")
                await layer.group_add(self.group, channel)
        except Exception:
            logger.exception("approvals: cannot subscribe to %s; the database stays the source of truth", self.group)
            channel = None
        finally:
            if not ready.done():
                ready.set_result(None)
        if channel is None:
            return
        try:
            while True:
                message = await layer.receive(channel)
                try:
                    await self.handle(message)
                except Exception:
                    logger.exception("approvals: handling a %s message failed", self.group)
        finally:
            with suppress(Exception):
                await layer.group_discard(self.group, channel)
