"""An operator opens what a browser call saved (a screenshot, a PDF) from the call that saved it."""

from __future__ import annotations

import uuid

from ..gateway import gateway
from ..models import ToolCall
from ..services import person_roles
from .errors import BrowserError
from .files import artifact_read
from .session import Who

SAVING_TOOLS = {"browser_screenshot": "screenshot", "browser_pdf": "pdf"}
MEDIA_TYPES = frozenset({"image/png", "image/jpeg", "application/pdf"})


def browser_artifact_open(*, user, call_id: uuid.UUID) -> tuple[str, bytes, str] | None:
    """(file name, bytes, media type) of the file a browser call saved, for an admin or an operator of its channel.

    None for a call that does not exist, saved nothing, or that this person may not see: all look the same.
    """
    call = (
        ToolCall.objects.select_related("agent", "channel")
        .filter(id=call_id, tool__in=SAVING_TOOLS, success=True)
        .first()
    )
    if call is None:
        return None
    if "admin" not in person_roles(user) and not call.channel.operators.filter(pk=user.pk).exists():
        return None
    reference = (call.output or {}).get(SAVING_TOOLS[call.tool])
    if not isinstance(reference, dict) or not isinstance(reference.get("path"), str):
        return None
    tool = gateway().registry.get(call.tool)
    runtime = tool.dependencies.get("browser") if tool is not None else None
    if runtime is None:
        return None
    try:
        data = artifact_read(runtime.workspace(Who(call.agent_id, call.agent.name)), reference["path"])
    except (BrowserError, FileNotFoundError):
        return None
    media_type = reference.get("media_type")
    return (
        reference["path"].rsplit("/", 1)[-1],
        data,
        media_type if media_type in MEDIA_TYPES else "application/octet-stream",
    )
