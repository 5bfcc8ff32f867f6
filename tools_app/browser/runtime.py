"""The browser runtime: one Chromium, started on first use and stopped when idle, driven from a thread of its own."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from nacl.secret import SecretBox
from playwright.async_api import Browser, Playwright, async_playwright
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import TimeoutError as PlaywrightTimeout

from ..net.client import Outbound
from ..net.guard import AllowList
from .errors import BrowserError
from .files import ProfileStore, WorkspaceFor, default_workspaces, workspace_path
from .interception import ProxySink
from .session import BrowserSession, Who

logger = logging.getLogger(__name__)
T = TypeVar("T")

CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
CRASHED = (
    "The browser process crashed during this call, so the call did not complete. The browser will be restarted on "
    "the next call; this session's tabs were lost, so open the page again."
)
RESTARTED = "The browser crashed earlier and was restarted: this session's earlier tabs are gone."


def _playwright_message(exc: Exception) -> str:
    return str(exc).split("\nCall log:", 1)[0].strip() or type(exc).__name__


class BrowserRuntime:
    """Lazily starts Chromium on its own event loop thread; each (agent, session) gets an isolated context."""

    def __init__(
        self,
        *,
        outbound: Outbound,
        data_dir: Path,
        executable: str = CHROMIUM,
        idle_s: float = 300.0,
        call_timeout_s: float = 120.0,
        profile_box: SecretBox | None = None,
        workspace_for: WorkspaceFor | None = None,
        max_sessions: int = 32,
    ):
        self.outbound = outbound
        self.executable = executable
        self.idle_s = idle_s
        self.call_timeout_s = call_timeout_s
        self.max_sessions = max_sessions
        self.profiles = ProfileStore(data_dir / "browser" / "profiles", profile_box)
        self.workspace_for = workspace_for or default_workspaces(data_dir / "workspaces")
        self.sink = ProxySink()
        self.launches = 0
        self.stops = 0
        self.crashes = 0
        self.pid: int | None = None
        self.last_launch_s: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self._pw: Playwright | None = None
        self._browser: Browser | None = None
        self._sessions: OrderedDict[Who, BrowserSession] = OrderedDict()
        self._bindings: dict[Who, str] = {}
        self._lost: set[Who] = set()
        self._epoch = 0
        self._active = 0
        self._last_used = 0.0
        self._idle_handle: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        self._stopping = False
        self._background: set[asyncio.Future] = set()

    @classmethod
    def from_settings(cls, *, outbound: Outbound, **options: Any) -> BrowserRuntime | None:
        """The wired runtime, or None (the browser tools answer "browser not configured") without a Chromium."""
        from django.conf import settings

        executable = settings.ALEPH_BROWSER_EXECUTABLE
        if not executable or not (os.path.isfile(executable) and os.access(executable, os.X_OK)):
            return None
        return cls(
            outbound=outbound,
            data_dir=Path(settings.DATA_DIR),
            executable=executable,
            idle_s=settings.ALEPH_BROWSER_IDLE_S,
            **options,
        )

    # -- the loop thread ------------------------------------------------------------------

    def _loop_get(self) -> asyncio.AbstractEventLoop:
        with self._thread_lock:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="aleph-browser", daemon=True)
                thread.start()
                if self._loop is None:
                    atexit.register(self._at_exit)
                self._loop, self._thread = loop, thread
                self._lock = asyncio.Lock()
            return self._loop

    def _submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop_get())

    def _at_exit(self) -> None:
        try:
            self.stop(timeout_s=10)
        except Exception:  # the process is ending; a browser that will not close dies with its driver
            logger.warning("the browser did not stop cleanly at exit", exc_info=True)

    # -- public surface -------------------------------------------------------------------

    @property
    def running(self) -> bool:
        browser = self._browser
        return browser is not None and browser.is_connected()

    def status(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "pid": self.pid,
            "launches": self.launches,
            "stops": self.stops,
            "crashes": self.crashes,
            "sessions": len(self._sessions),
            "idle_s": self.idle_s,
            "last_launch_s": self.last_launch_s,
        }

    async def run(self, who: Who, action: Callable[[BrowserSession], Awaitable[T]], *, persist: bool = False) -> T:
        """Run `action` with the session's context on the browser's loop; the allow list is read here, per call."""
        allow = await self.outbound.allow_list()
        return await asyncio.wrap_future(self._submit(self._serve(who, allow, action, persist)))

    def stop(self, timeout_s: float = 30.0) -> None:
        """Close every session (saving profiles) and the browser; the next call starts it again."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._submit(self._shutdown(idle=False)).result(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the browser and the loop thread (tests, benchmarks)."""
        self.stop(timeout_s)
        with self._thread_lock:
            loop, thread = self._loop, self._thread
            self._loop, self._thread = None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout_s)
            loop.close()

    def workspace(self, who: Who) -> Path:
        return workspace_path(self.workspace_for, agent_id=who.agent_id, agent_name=who.agent_name)

    # -- one call -------------------------------------------------------------------------

    async def _serve(
        self, who: Who, allow: AllowList, action: Callable[[BrowserSession], Awaitable[T]], persist: bool
    ) -> T:
        self._active += 1
        epoch = self._epoch
        try:
            async with asyncio.timeout(self.call_timeout_s):
                async with self._lock:
                    await self._ready()
                    epoch = self._epoch
                    session = await self._session(who)
                session.interceptor.allow_set(allow)
                async with session.lock:
                    result = await action(session)
                current = self._sessions.get(who)
                if persist and current is not None and current.profile and not current.closed:
                    await self.profile_save(current)
                return result
        except Exception as exc:
            if isinstance(exc, PlaywrightError) and "closed" in str(exc):
                # The browser's death reaches a pending call and the disconnect event in either order.
                deadline = time.monotonic() + 1.0
                while self._epoch == epoch and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            if self._epoch != epoch:
                raise BrowserError("browser_crashed", CRASHED) from None
            if isinstance(exc, BrowserError):
                raise
            if isinstance(exc, TimeoutError):
                raise BrowserError(
                    "timeout", f"The browser call did not finish within {self.call_timeout_s:g} s."
                ) from None
            if isinstance(exc, PlaywrightTimeout):
                raise BrowserError("timeout", _playwright_message(exc)) from None
            if isinstance(exc, PlaywrightError):
                raise BrowserError("browser_error", _playwright_message(exc)) from None
            raise
        finally:
            self._active -= 1
            self._last_used = time.monotonic()
            self._idle_arm()

    async def _ready(self) -> None:
        if self._browser is not None and self._browser.is_connected():
            return
        self._browser = None
        try:
            await self._launch()
        except BrowserError:
            raise
        except Exception:
            # A driver that died with the browser cannot launch another: start a fresh one, once.
            await self._driver_stop()
            await self._launch()

    async def _launch(self) -> None:
        started = time.perf_counter()
        port = await self.sink.start()
        if self._pw is None:
            self._pw = await async_playwright().start()
        # Everything Chromium would send past the interception (redirect hops of fulfilled requests, preconnects,
        # its own background services) goes to the refusing proxy on loopback, never to the network.
        args = [
            *LAUNCH_ARGS,
            f"--proxy-server=http://127.0.0.1:{port}",
            "--proxy-bypass-list=<-loopback>",
            "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
        ]
        try:
            browser = await self._pw.chromium.launch(
                executable_path=self.executable,
                args=args,
                headless=True,
                handle_sigint=False,
                handle_sigterm=False,
                handle_sighup=False,
                timeout=30_000,
            )
        except PlaywrightError as exc:
            raise BrowserError(
                "browser_unavailable", f"Chromium ({self.executable}) did not start: {_playwright_message(exc)}"
            ) from None
        browser.on("disconnected", self._disconnected)
        self._browser = browser
        self.pid = await self._browser_pid(browser)
        self.launches += 1
        self.last_launch_s = time.perf_counter() - started
        logger.info("browser started (pid %s) in %.2f s", self.pid, self.last_launch_s)

    @staticmethod
    async def _browser_pid(browser: Browser) -> int | None:
        cdp = await browser.new_browser_cdp_session()
        try:
            info = await cdp.send("SystemInfo.getProcessInfo")
        finally:
            await cdp.detach()
        return next((p["id"] for p in info.get("processInfo", []) if p.get("type") == "browser"), None)

    def _disconnected(self, browser: Browser) -> None:
        if browser is not self._browser or self._stopping:
            return
        logger.warning("the browser (pid %s) went away; it will be restarted on the next call", self.pid)
        self.crashes += 1
        self._epoch += 1
        self._lost |= set(self._sessions)
        for session in self._sessions.values():
            session.closed = True
            self._spawn(session.interceptor.aclose())
        self._sessions.clear()
        self._browser = None
        self.pid = None

    async def _driver_stop(self) -> None:
        pw, self._pw = self._pw, None
        if pw is not None:
            # A driver that already died has nothing left to stop.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pw.stop(), 10)

    # -- sessions -------------------------------------------------------------------------

    async def _session(self, who: Who) -> BrowserSession:
        session = self._sessions.get(who)
        if session is not None and not session.closed:
            self._sessions.move_to_end(who)
            return session
        profile = self._bindings.get(who)
        state = await asyncio.to_thread(self.profiles.load, who.agent_id, profile) if profile else None
        assert self._browser is not None
        session = await BrowserSession.open(
            self._browser, who=who, outbound=self.outbound, storage_state=state, profile=profile
        )
        if who in self._lost:
            self._lost.discard(who)
            session.notice = RESTARTED
        self._sessions[who] = session
        while len(self._sessions) > self.max_sessions:
            _, oldest = self._sessions.popitem(last=False)
            async with oldest.lock:
                await self._retire(oldest)
        return session

    async def _retire(self, session: BrowserSession) -> None:
        if session.profile and not session.closed:
            try:
                await self.profile_save(session)
            except Exception:  # closing must not fail because a profile could not be written; say so in the log
                logger.warning("could not save browser profile %r", session.profile, exc_info=True)
        await session.close()

    def sessions_of(self, agent_id: int) -> list[BrowserSession]:
        return [s for who, s in self._sessions.items() if who.agent_id == agent_id and not s.closed]

    async def session_close(self, session: BrowserSession) -> None:
        """Called from an action (on the browser's loop): close this session's context for good."""
        self._sessions.pop(session.who, None)
        await self._retire(session)

    async def profile_use(self, session: BrowserSession, name: str | None) -> BrowserSession:
        """Reopen the session on a saved profile (or on none): its tabs close, its cookies become the profile's."""
        if name is not None:
            self.profiles.check_name(name)
        who = session.who
        await self.session_close(session)
        if name is None:
            self._bindings.pop(who, None)
        else:
            self._bindings[who] = name
        async with self._lock:
            return await self._session(who)

    async def profile_save(self, session: BrowserSession) -> int:
        if not session.profile:
            raise BrowserError("no_profile", "This session uses no profile; choose one with browser_profile use.")
        state = await session.context.storage_state()
        return await asyncio.to_thread(self.profiles.save, session.who.agent_id, session.profile, state)

    async def profile_delete(self, who: Who, name: str) -> bool:
        for bound, profile in list(self._bindings.items()):
            if bound.agent_id == who.agent_id and profile == name:
                self._bindings.pop(bound)
                session = self._sessions.get(bound)
                if session is not None:
                    session.profile = None
        return await asyncio.to_thread(self.profiles.delete, who.agent_id, name)

    # -- stopping -------------------------------------------------------------------------

    def _idle_arm(self) -> None:
        if self._idle_handle is not None:
            self._idle_handle.cancel()
            self._idle_handle = None
        if self._browser is not None:
            self._idle_handle = asyncio.get_running_loop().call_later(self.idle_s, self._idle_fire)

    def _idle_fire(self) -> None:
        self._idle_handle = None
        if self._active == 0 and self._browser is not None:
            self._spawn(self._shutdown(idle=True))

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _shutdown(self, *, idle: bool) -> None:
        async with self._lock:
            if idle and (self._active > 0 or time.monotonic() - self._last_used < self.idle_s * 0.9):
                return
            if self._browser is None and self._pw is None:
                return
            self._stopping = True
            try:
                for session in list(self._sessions.values()):
                    await self._retire(session)
                self._sessions.clear()
                if self._browser is not None:
                    try:
                        await asyncio.wait_for(self._browser.close(), 10)
                    except Exception:  # a browser that will not close politely dies with its driver below
                        logger.warning("the browser did not close cleanly", exc_info=True)
                await self._driver_stop()
                await self.sink.stop()
            finally:
                self._browser = None
                self.pid = None
                self._stopping = False
                self.stops += 1
                if self._idle_handle is not None:
                    self._idle_handle.cancel()
                    self._idle_handle = None
            logger.info("browser stopped (%s)", "idle" if idle else "asked")
