"""Notes: an agent's own memory, written and searched through the chokepoint."""

from functools import reduce
from operator import and_

from asgiref.sync import sync_to_async
from django.db.models import Q
from pydantic import Field

from ..chokepoint.base import MUTATING, READ_ONLY, ToolArgs, ToolContext, ToolResult, TypedTool
from ..models import Note


class NoteWrite(TypedTool):
    name = "note_write"
    description = "Store a note in this agent's memory, to find later with note_search."
    facts = MUTATING

    class Args(ToolArgs):
        text: str = Field(min_length=1, max_length=20_000, description="The note to remember.")

    async def call(self, args: Args, ctx: ToolContext) -> ToolResult:
        note = await Note.objects.acreate(agent_id=ctx.agent_id, text=args.text)
        return ToolResult.ok({"id": note.id, "stored_chars": len(args.text)})


class NoteSearch(TypedTool):
    name = "note_search"
    description = "Search this agent's notes: every word of the query must appear; newest first."
    facts = READ_ONLY

    class Args(ToolArgs):
        query: str = Field(min_length=1, max_length=500, description="Words that must all appear in a note.")
        limit: int = Field(default=10, ge=1, le=100, description="How many notes to return at most.")

    async def call(self, args: Args, ctx: ToolContext) -> ToolResult:
        return ToolResult.ok(await sync_to_async(self._search)(args, ctx.agent_id))

    @staticmethod
    def _search(args: Args, agent_id: int) -> dict:
        words = args.query.split()
        if not words:
            return {"matches": [], "count": 0}
        condition = reduce(and_, (Q(text__icontains=word) for word in words))
        notes = Note.objects.filter(agent_id=agent_id).filter(condition)[: args.limit]
        matches = [{"id": n.id, "text": n.text, "created_at": n.created_at.isoformat()} for n in notes]
        return {"matches": matches, "count": len(matches)}
