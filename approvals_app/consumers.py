"""The operators' live feed at /ws/approvals/: authenticated on connect, authorized on every event."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth import get_user_model
from django.utils import timezone

from tools_app.services import ApplicationError, person_roles

from .models import Status
from .serializers import SocketDecideSerializer
from .services import CARDS_GROUP, approval_card, approval_decide, approval_find, approval_list, deciders_of

logger = logging.getLogger(__name__)
DECIDING_ROLES = {"admin", "operator"}
AUDIENCE_CACHE = 1024
_audiences: OrderedDict[str, asyncio.Future] = OrderedDict()


async def event_audience(event_id: str, channel_id: int) -> frozenset[int]:
    """Who may see one event, read from the database once per event and process and shared by every socket."""
    pending = _audiences.get(event_id)
    if pending is None:
        pending = asyncio.ensure_future(database_sync_to_async(deciders_of)(channel_id=channel_id))
        _audiences[event_id] = pending
        while len(_audiences) > AUDIENCE_CACHE:
            _audiences.popitem(last=False)
    return await asyncio.shield(pending)


class ApprovalConsumer(AsyncJsonWebsocketConsumer):
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
        await self.channel_layer.group_add(CARDS_GROUP, self.channel_name)
        await self.accept()
        cards = await database_sync_to_async(self._pending_cards)()
        await self.send_json({"type": "approval.snapshot", "requests": cards, "now": timezone.now().isoformat()})

    async def disconnect(self, code: int) -> None:
        if self.user_id is not None:
            await self.channel_layer.group_discard(CARDS_GROUP, self.channel_name)

    def _person(self):
        return get_user_model().objects.filter(pk=self.user_id, is_active=True).first()

    def _pending_cards(self) -> list[dict[str, Any]]:
        person = self._person()
        if person is None:
            return []
        return [approval_card(r) for r in approval_list(person=person, status=Status.PENDING)]

    # -- events: each one re-checks that this person may decide the channel ------------------------

    async def _may_see(self, event: dict[str, Any]) -> bool:
        try:
            audience = await event_audience(event["event"], event["channel_id"])
        except Exception:
            logger.exception("approvals: cannot tell who may see an event; it is withheld")
            return False
        return self.user_id in audience

    async def approval_requested(self, event: dict[str, Any]) -> None:
        if await self._may_see(event):
            await self.send_json({"type": "approval.requested", "request": event["request"]})

    async def approval_resolved(self, event: dict[str, Any]) -> None:
        if await self._may_see(event):
            await self.send_json({"type": "approval.resolved", "resolution": event["resolution"]})

    async def approval_expired(self, event: dict[str, Any]) -> None:
        if await self._may_see(event):
            await self.send_json({"type": "approval.expired", "resolution": event["resolution"]})

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
