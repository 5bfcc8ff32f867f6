"""Serve Aleph's tools over MCP on stdin/stdout: one agent (ALEPH_AGENT_TOKEN) in one channel."""

import asyncio
import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from tools_app.mcp.server import agent_for_token, stdio_serve
from tools_app.policy_store import current_policy


class Command(BaseCommand):
    help = "Serve this agent's tools over MCP (stdio); every call goes through the chokepoint."

    def add_arguments(self, parser):
        parser.add_argument("--channel", default=settings.ALEPH_MCP_CHANNEL, help="the channel the calls run in")
        parser.add_argument("--session", default=None, help="a session key grouping the calls (up to 100 characters)")

    def handle(self, *args, channel: str, session: str | None, **options):
        token = os.environ.get("ALEPH_AGENT_TOKEN", "").strip()
        if not token:
            raise CommandError("Set ALEPH_AGENT_TOKEN to the agent's API token.")
        agent = agent_for_token(token)
        if agent is None:
            raise CommandError("ALEPH_AGENT_TOKEN is not the token of an active agent.")
        if not channel:
            raise CommandError("Name the channel with --channel (or set ALEPH_MCP_CHANNEL).")
        if channel not in current_policy().channels:
            raise CommandError(f"No channel named {channel!r}.")
        if session is not None and not 0 < len(session) <= 100:
            raise CommandError("--session must be 1-100 characters.")
        asyncio.run(stdio_serve(agent_id=agent[0], agent_name=agent[1], channel=channel, session_key=session))
