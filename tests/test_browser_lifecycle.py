"""The browser starts on first use, stops when idle, and after a crash restarts on the next call."""

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from tools_app.browser import BrowserRuntime
from tools_app.browser.testing import PageServer, ToolDriver
from tools_app.net import AllowList, Outbound

PAGES = Path(__file__).resolve().parent / "browser_pages"
CHROMIUM = "/usr/bin/chromium"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason="Debian's chromium is not installed"),
]


@pytest.fixture(scope="module")
def server():
    with PageServer(PAGES) as running:
        yield running


@pytest.fixture
def runtime(server, tmp_path):
    allowed = AllowList.parse([f"127.0.0.1:{server.port}"])
    browser = BrowserRuntime(outbound=Outbound(allow_source=lambda: allowed), data_dir=tmp_path, idle_s=1.0)
    yield browser
    browser.close()


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting to be reaped."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


async def eventually(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def test_the_browser_starts_lazily_and_stops_when_idle(runtime, server):
    assert runtime.status() == {
        "running": False,
        "pid": None,
        "launches": 0,
        "stops": 0,
        "crashes": 0,
        "sessions": 0,
        "idle_s": 1.0,
        "last_launch_s": None,
    }
    assert runtime._thread is None
    driver = ToolDriver(runtime)
    await driver.ok("browser_open", url=server.url("/form.html"))
    pid = runtime.pid
    assert runtime.running and runtime.launches == 1 and alive(pid)
    await asyncio.sleep(0.6)
    await driver.ok("browser_snapshot")
    await asyncio.sleep(0.6)
    assert runtime.running, "a call within the idle time keeps the browser"
    assert await eventually(lambda: runtime.stops == 1, 5)
    assert not runtime.running and runtime.status()["sessions"] == 0
    assert await eventually(lambda: not alive(pid), 5), f"chromium {pid} outlived the stop"
    reopened = await driver.ok("browser_open", url=server.url("/keys.html"))
    assert reopened["tab_id"] == "t1" and runtime.launches == 2 and runtime.pid != pid


async def test_a_crashed_browser_is_restarted_on_the_next_call(runtime, server):
    driver = ToolDriver(runtime)
    await driver.ok("browser_open", url=server.url("/form.html"))
    pid = runtime.pid
    waiting = asyncio.ensure_future(driver("browser_wait_for", time_s=20))
    await asyncio.sleep(0.5)
    started = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    crashed = await asyncio.wait_for(waiting, 10)
    assert time.monotonic() - started < 5
    assert crashed.error.code == "browser_crashed"
    assert "crashed during this call" in crashed.error.message
    assert "restarted on the next call" in crashed.error.message
    assert runtime.crashes == 1 and not runtime.running

    reopened = await driver.ok("browser_open", url=server.url("/form.html"))
    assert runtime.launches == 2 and runtime.pid not in (None, pid)
    assert reopened["tab_id"] == "t1"
    assert "crashed earlier and was restarted" in reopened["notice"]
