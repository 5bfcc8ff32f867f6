"""The browser runtime: Chromium via Playwright, an isolated context per agent session, every request vetted."""

from .errors import BrowserError
from .runtime import CHROMIUM, LAUNCH_ARGS, BrowserRuntime
from .session import BrowserSession, Tab, Who

__all__ = ["CHROMIUM", "LAUNCH_ARGS", "BrowserError", "BrowserRuntime", "BrowserSession", "Tab", "Who"]
