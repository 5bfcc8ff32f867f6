"""One agent session's browser: an isolated context, its tabs, what its pages logged, and how elements are found."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from playwright.async_api import Browser, BrowserContext, CDPSession, Dialog, ElementHandle, Locator, Page, Request

from ..net.client import Outbound
from ..net.guard import MAX_REDIRECTS
from .errors import BrowserError
from .interception import LOG_LIMIT, Interceptor

T = TypeVar("T")

MAX_TABS = 20
VIEWPORT = {"width": 1280, "height": 800}
ACTION_TIMEOUT_MS = 10_000
NAVIGATION_TIMEOUT_MS = 30_000
REF = re.compile(r"\[ref=([A-Za-z0-9]+)\]")
# One animation frame and a macrotask: long enough for a click's navigation to reach the interceptor.
SETTLE_SCRIPT = "() => new Promise(done => requestAnimationFrame(() => setTimeout(done, 0)))"
POLL_S = 0.01


@dataclass(frozen=True)
class Who:
    """Whose browser: an agent and its session (the empty key for calls made outside a session)."""

    agent_id: int
    agent_name: str
    session_key: str = ""


@dataclass
class Tab:
    id: str
    page: Page
    refs: frozenset[str] = frozenset()
    dialog: Dialog | None = None
    dialog_opened: asyncio.Event = field(default_factory=asyncio.Event)
    blocked_action: asyncio.Future | None = None
    requested: int = 0
    answered: int = 0
    last_outcome: str = ""
    last_entry: Any = None
    committed: int = 0
    cdp: CDPSession | None = None

    def navigation_requested(self) -> None:
        self.requested += 1

    def navigation_answered(self, entry: Any) -> None:
        self.answered += 1
        self.last_outcome = entry.outcome
        self.last_entry = entry

    def dialog_info(self) -> dict[str, Any] | None:
        if self.dialog is None:
            return None
        info = {"type": self.dialog.type, "message": self.dialog.message}
        if self.dialog.type == "prompt":
            info["default_value"] = self.dialog.default_value
        return info

    def ensure_no_dialog(self) -> None:
        if self.dialog is not None:
            info = self.dialog_info()
            raise BrowserError(
                "dialog_open",
                f"A {info['type']} dialog is open on tab {self.id} ({info['message']!r}); the page is paused until "
                "it is answered with browser_dialog.",
                tab_id=self.id,
                dialog=info,
            )


async def _until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


class BrowserSession:
    """An isolated browser context for one (agent, session): nothing in it is visible to another session."""

    def __init__(self, *, who: Who, context: BrowserContext, interceptor: Interceptor, profile: str | None):
        self.who = who
        self.context = context
        self.interceptor = interceptor
        self.profile = profile
        self.tabs: dict[str, Tab] = {}
        self.current: str | None = None
        self.console: deque[dict[str, Any]] = deque(maxlen=LOG_LIMIT)
        self.console_seq = 0
        self.lock = asyncio.Lock()
        self.media: dict[str, Any] = {}
        self.overrides: dict[str, Any] = {}
        self.notice: str | None = None
        self.closed = False
        self._tab_seq = 0
        self._by_page: dict[Page, Tab] = {}
        self._background: set[asyncio.Future] = set()

    @classmethod
    async def open(
        cls, browser: Browser, *, who: Who, outbound: Outbound, storage_state: dict | None, profile: str | None
    ) -> BrowserSession:
        context = await browser.new_context(
            storage_state=storage_state,
            service_workers="block",
            accept_downloads=False,
            viewport=dict(VIEWPORT),
        )
        context.set_default_timeout(ACTION_TIMEOUT_MS)
        context.set_default_navigation_timeout(NAVIGATION_TIMEOUT_MS)
        session: BrowserSession
        interceptor = Interceptor(outbound=outbound, tab_of=lambda request: session.tab_of(request))
        session = cls(who=who, context=context, interceptor=interceptor, profile=profile)
        await context.route("**/*", interceptor.handle)
        await context.route_web_socket(re.compile(".*"), interceptor.websocket)
        context.on("page", session.adopt)
        return session

    async def close(self) -> None:
        self.closed = True
        for tab in self.tabs.values():
            if tab.blocked_action is not None:
                tab.blocked_action.cancel()
        # The browser may already be gone; the context is unusable either way.
        with contextlib.suppress(Exception):
            await self.context.close()
        await self.interceptor.aclose()

    # -- tabs -----------------------------------------------------------------------------

    def adopt(self, page: Page) -> Tab | None:
        """Every page of the context becomes a tab: ones we open, and popups the page opens itself (within limits)."""
        tab = self._by_page.get(page)
        if tab is not None:
            return tab
        if len(self.tabs) >= MAX_TABS:
            self._spawn(page.close())
            return None
        self._tab_seq += 1
        tab = Tab(id=f"t{self._tab_seq}", page=page)
        self.tabs[tab.id] = tab
        self._by_page[page] = tab
        if self.current is None:
            self.current = tab.id
        page.on("console", lambda message: self._console_add(tab, message.type, message.text, message.location))
        page.on("pageerror", lambda error: self._console_add(tab, "pageerror", str(error), None))
        page.on("dialog", lambda dialog: self._dialog_opened(tab, dialog))
        page.on("framenavigated", lambda frame: self._navigated(tab, frame))
        page.on("close", lambda _: self._closed(tab))
        if self.media or self.overrides:
            self._spawn(self.emulation_apply(tab))
        return tab

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def tab_new(self) -> Tab:
        if len(self.tabs) >= MAX_TABS:
            raise BrowserError("too_many_tabs", f"A session may hold at most {MAX_TABS} tabs; close one first.")
        tab = self.adopt(await self.context.new_page())
        assert tab is not None
        self.current = tab.id
        return tab

    def tab(self, tab_id: str | None = None) -> Tab:
        if tab_id is None:
            if self.current is None or self.current not in self.tabs:
                raise BrowserError("no_tab", "No tab is open in this session; open one with browser_open.")
            return self.tabs[self.current]
        tab = self.tabs.get(tab_id)
        if tab is None:
            raise BrowserError(
                "tab_not_found", f"No tab {tab_id!r} in this session; open tabs: {list(self.tabs)}.", tab_id=tab_id
            )
        return tab

    def tab_of(self, request: Request) -> Tab | None:
        try:
            return self._by_page.get(request.frame.page)
        except Exception:  # requests of workers have no frame
            return None

    def _closed(self, tab: Tab) -> None:
        self.tabs.pop(tab.id, None)
        self._by_page.pop(tab.page, None)
        if self.current == tab.id:
            self.current = next(reversed(self.tabs), None)

    def _navigated(self, tab: Tab, frame: Any) -> None:
        if frame.parent_frame is None:
            # The document now shown answers every navigation requested so far.
            tab.committed = tab.requested

    def _console_add(self, tab: Tab, kind: str, text: str, location: dict | None) -> None:
        self.console_seq += 1
        entry = {"seq": self.console_seq, "tab_id": tab.id, "type": kind, "text": text[:4000]}
        if location and location.get("url"):
            entry["location"] = f"{location['url']}:{location.get('lineNumber', 0)}"
        self.console.append(entry)

    def _dialog_opened(self, tab: Tab, dialog: Dialog) -> None:
        tab.dialog = dialog
        tab.dialog_opened.set()
        self._console_add(tab, "dialog", f"{dialog.type}: {dialog.message}", None)

    async def tabs_describe(self) -> list[dict[str, Any]]:
        described = []
        for tab in list(self.tabs.values()):
            described.append(
                {"tab_id": tab.id, "url": tab.page.url, "title": await _title(tab), "current": tab.id == self.current}
            )
        return described

    async def state(self, tab: Tab) -> dict[str, Any]:
        """Where a tab stands after an action: its URL and title, and an open dialog if there is one."""
        state = {"tab_id": tab.id, "url": tab.page.url, "title": await _title(tab)}
        if tab.dialog is not None:
            state["dialog"] = tab.dialog_info()
            state["note"] = "A dialog is open and pauses the page; answer it with browser_dialog."
        if self.notice:
            state["notice"] = self.notice
            self.notice = None
        return state

    # -- element targeting ----------------------------------------------------------------

    async def snapshot(self, tab: Tab, *, depth: int | None = None) -> str:
        text = await tab.page.aria_snapshot(mode="ai", depth=depth)
        tab.refs = frozenset(REF.findall(text))
        return text

    async def locate(self, tab: Tab, ref: str) -> Locator:
        """The element a ref of the tab's latest snapshot names; anything else is stale and says what to do."""
        stale = BrowserError(
            "stale_ref",
            f"ref {ref!r} is not an element of the latest snapshot of tab {tab.id} (the page may have changed). "
            "Take a new browser_snapshot and use a ref_id from it.",
            ref_id=ref,
            tab_id=tab.id,
        )
        if ref not in tab.refs:
            raise stale
        locator = tab.page.get_by_ref(ref)
        if await locator.count() == 0:
            raise stale
        return locator

    async def element_at(self, tab: Tab, x: float, y: float) -> ElementHandle:
        self.point_check(tab, x, y)
        handle = await tab.page.evaluate_handle("([x, y]) => document.elementFromPoint(x, y)", [x, y])
        element = handle.as_element()
        if element is None:
            raise BrowserError("no_element", f"No element is at ({x:g}, {y:g}) in tab {tab.id}.", x=x, y=y)
        return element

    @staticmethod
    def point_check(tab: Tab, x: float, y: float) -> None:
        size = tab.page.viewport_size or VIEWPORT
        if not (0 <= x < size["width"] and 0 <= y < size["height"]):
            raise BrowserError(
                "outside_viewport",
                f"({x:g}, {y:g}) is outside the {size['width']}x{size['height']} viewport of tab {tab.id}.",
                viewport=size,
            )

    async def center(self, tab: Tab, ref: str) -> tuple[float, float]:
        locator = await self.locate(tab, ref)
        await locator.scroll_into_view_if_needed()
        box = await locator.bounding_box()
        if box is None:
            raise BrowserError("not_visible", f"The element {ref!r} is not visible, so it has no position.", ref_id=ref)
        return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2

    # -- actions --------------------------------------------------------------------------

    async def act(self, tab: Tab, action: Callable[[], Awaitable[T]], *, settle: bool = True) -> T | None:
        """Run an action on a tab; a dialog it opens ends the wait (the action finishes once the dialog is answered)."""
        tab.ensure_no_dialog()
        mark = tab.requested
        tab.dialog_opened.clear()
        task = asyncio.ensure_future(action())
        opened = asyncio.ensure_future(tab.dialog_opened.wait())
        try:
            await asyncio.wait({task, opened}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            opened.cancel()
        if not task.done():
            tab.blocked_action = task
            task.add_done_callback(lambda done: done.cancelled() or done.exception())
            return None
        result = task.result()
        if settle:
            await self.settle(tab, mark, grace=True)
        return result

    async def settle(self, tab: Tab, mark: int, *, grace: bool) -> None:
        """Wait for a navigation requested since `mark` to load, following redirect interstitials to the final page."""
        if grace and tab.dialog is None:
            # An error means the document went away: a navigation started, which is what we look for.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(tab.page.evaluate(SETTLE_SCRIPT), 0.5)
        seen = mark
        timeout_s = NAVIGATION_TIMEOUT_MS / 1000
        for _ in range(MAX_REDIRECTS + 2):
            if tab.requested == seen or tab.dialog is not None:
                return
            if not await _until(lambda: tab.answered >= tab.requested, timeout_s):
                raise BrowserError("timeout", f"The page in tab {tab.id} did not answer within {timeout_s:g} s.")
            seen = tab.requested
            if tab.last_outcome not in ("ok", "redirected"):
                return
            if not await _until(lambda s=seen: tab.committed >= s or tab.dialog is not None, timeout_s):
                return
            await tab.page.wait_for_load_state("load")
            if tab.last_outcome != "redirected":
                return
            # The redirect's interstitial replaces itself once loaded: its successor's request follows at once.
            await _until(lambda s=seen: tab.requested > s, 2.0)

    async def goto(self, tab: Tab, url: str) -> dict[str, Any]:
        """Navigate and follow redirects; a blocked or failed navigation is an error naming why."""
        tab.ensure_no_dialog()
        mark = tab.requested
        failure: Exception | None = None
        try:
            await tab.page.goto(url, wait_until="load")
        except Exception as exc:  # judged below: the network log says whether the engine refused it
            failure = exc
        if failure is None:
            await self.settle(tab, mark, grace=False)
        self.navigation_check(tab, mark, failure)
        return await self.state(tab)

    @staticmethod
    def navigation_check(tab: Tab, mark: int, failure: Exception | None) -> None:
        """After a navigation since `mark`: the engine's refusal, a failed fetch, or the browser's own error."""
        entry = tab.last_entry if tab.requested > mark else None
        if entry is not None and entry.outcome == "blocked":
            raise BrowserError(
                "ssrf_blocked", entry.reason or f"{entry.url} was refused", url=entry.url, rule=entry.rule or ""
            )
        if entry is not None and entry.outcome == "failed" and failure is not None:
            raise BrowserError("navigation_failed", f"{entry.url}: {entry.reason}", url=entry.url)
        if failure is not None:
            raise failure

    # -- emulation ------------------------------------------------------------------------

    async def emulation_apply(self, tab: Tab) -> None:
        if self.media:
            await tab.page.emulate_media(**self.media)
        if self.overrides:
            # Overrides live as long as the CDP session that set them, so each tab keeps its own open.
            if tab.cdp is None:
                tab.cdp = await self.context.new_cdp_session(tab.page)
            if "timezone_id" in self.overrides:
                await tab.cdp.send("Emulation.setTimezoneOverride", {"timezoneId": self.overrides["timezone_id"]})
            if "locale" in self.overrides:
                await tab.cdp.send("Emulation.setLocaleOverride", {"locale": self.overrides["locale"]})
            if "user_agent" in self.overrides:
                await tab.cdp.send("Emulation.setUserAgentOverride", {"userAgent": self.overrides["user_agent"]})


async def _title(tab: Tab) -> str:
    try:
        return await asyncio.wait_for(tab.page.title(), 2)
    except Exception:  # a page mid-navigation or paused by a dialog may not answer; the title is only a courtesy
        return ""
