"""The operators' live feed at /ws/approvals/: authenticated on connect, authorized on every event."""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth import get_user_model
from django.utils import timezone

from tools_app.services import ApplicationError, person_roles

from .listening import GroupListener
from .models import Status
from .serializers import SocketDecideSerializer
from .services import CARDS_GROUP, approval_card, approval_decide, approval_find, approval_list

logger = logging.getLogger(__name__)
DECIDING_ROLES = {"admin", "operator"}


class _Feed:
    """This event loop's sockets and one subscription for all of them: each event is serialized once, and every
    socket checks that its person is in the event's audience, which the sender read from the database for it."""

    def __init__(self):
        self.sockets: set[ApprovalConsumer] = set()
        self.listener = GroupListener(CARDS_GROUP, self.deliver)

    async def join(self, socket: ApprovalConsumer) -> None:
        self.sockets.add(socket)
        await self.listener.start()

    def leave(self, socket: ApprovalConsumer) -> None:
        self.sockets.discard(socket)
        if not self.sockets:
            self.listener.stop()

    async def deliver(self, event: dict[str, Any]) -> None:
        audience = frozenset(event.get("audience", ()))
        text = json.dumps(event["payload"])
        for socket in list(self.sockets):
            await socket.approval_event(text, audience)


_feeds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Feed] = weakref.WeakKeyDictionary()


def _feed() -> _Feed:
    loop = asyncio.get_running_loop()
    feed = _feeds.get(loop)
    if feed is None:
        feed = _feeds[loop] = _Feed()
    return feed


class ApprovalConsumer(AsyncJsonWebsocketConsumer):
    # No channel per socket: the process's feed holds the one subscription and hands each socket its events.
    channel_layer_alias = None
    user_id: int | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        roles = await database_sync_to_async(person_roles)(user)
        if not roles & DECIDING_ROLES:
            await self.close(code=4403)
            return
        self.user_id = user.pk
        # Joined before the snapshot is read, so no card falls between the two.
        await _feed().join(self)
        await self.accept()
        cards = await database_sync_to_async(self._pending_cards)()
        await self.send_json({"type": "approval.snapshot", "requests": cards, "now": timezone.now().isoformat()})

    async def disconnect(self, code: int) -> None:
        if self.user_id is not None:
            _feed().leave(self)

    def _person(self):
        return get_user_model().objects.filter(pk=self.user_id, is_active=True).first()

    def _pending_cards(self) -> list[dict[str, Any]]:
        person = self._person()
        if person is None:
            return []
        return [approval_card(r) for r in approval_list(person=person, status=Status.PENDING)]

    async def approval_event(self, text: str, audience: frozenset[int]) -> None:
        """approval.requested, .resolved and .expired: sent only if this person may decide the event's channel now."""
        if self.user_id not in audience:
            return
        try:
            await self.send(text_data=text)
        except Exception:  # a socket closing mid-broadcast must not stop the others' delivery
            logger.debug("approvals: a socket closed during delivery", exc_info=True)

    # -- what a client may send: {"type": "decide", ...} -----------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            content = json.loads(text_data or "")
        except ValueError:
            await self.send_json(_error(None, "invalid_json", "Send one JSON object per message."))
            return
        if not isinstance(content, dict) or content.get("type") != "decide":
            await self.send_json(
                _error(None, "unknown_message", 'The only message a client sends is {"type": "decide"}.')
            )
            return
        await self.send_json(await database_sync_to_async(self._decide)(content))

    def _decide(self, content: dict[str, Any]) -> dict[str, Any]:
        serializer = SocketDecideSerializer(data=content)
        if not serializer.is_valid():
            field, problems = next(iter(serializer.errors.items()))
            return _error(content.get("id"), "invalid_request", f"{field}: {problems[0]}", serializer.errors)
        body = serializer.validated_data
        person = self._person()
        if person is None:
            return _error(str(body["id"]), "not_authenticated", "Your account is no longer active.")
        try:
            request = approval_find(person=person, request_id=body["id"])
            decided = approval_decide(
                request=request,
                operator=person,
                decision=body["decision"],
                scope=body["scope"],
                reason=body["reason"],
                until=body["until"],
                match=body["match"],
            )
        except ApplicationError as exc:
            return _error(str(body["id"]), exc.code, exc.message, exc.detail)
        return {"type": "decide.ok", "id": str(decided.id), "status": decided.status}


def _error(request_id: str | None, code: str, message: str, detail: dict | None = None) -> dict[str, Any]:
    return {
        "type": "decide.error",
        "id": request_id,
        "error": {"code": code, "message": message, "detail": detail or {}},
    }
