"""Browser tools: snapshot + click round trip on a local page, and cold start against warm, beside plain Playwright."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

import django

django.setup()

from playwright.async_api import async_playwright  # noqa: E402

from bench.report import median, millis, percentile, table, target  # noqa: E402
from tools_app.browser import CHROMIUM, LAUNCH_ARGS, BrowserRuntime  # noqa: E402
from tools_app.browser.testing import PageServer, ToolDriver, ref_of  # noqa: E402
from tools_app.net import AllowList, Outbound  # noqa: E402

PAGES = Path(__file__).resolve().parent.parent / "tests" / "browser_pages"
ROUND_TRIPS = 40
COLD = 3
WARM = 6
BUTTON = "button"


async def raw_round_trip(page) -> None:
    snapshot = await page.aria_snapshot(mode="ai")
    await page.get_by_ref(ref_of(snapshot, BUTTON)).click()


async def aleph_round_trip(driver: ToolDriver) -> None:
    snapshot = (await driver.ok("browser_snapshot"))["snapshot"]
    await driver.ok("browser_click", ref_id=ref_of(snapshot, BUTTON))


async def raw_open(browser, url: str):
    context = await browser.new_context()
    page = await context.new_page()
    await page.goto(url)
    return context, page


async def measure(server: PageServer, data_dir: Path) -> dict[str, list[float]]:
    url = server.url("/widgets.html")
    allowed = AllowList.parse([f"127.0.0.1:{server.port}"])
    samples: dict[str, list[float]] = {
        key: [] for key in ("raw cold", "aleph cold", "raw warm", "aleph warm", "raw trip", "aleph trip")
    }

    for _ in range(COLD):
        started = time.perf_counter()
        playwright = await async_playwright().start()
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=list(LAUNCH_ARGS), headless=True)
        await raw_open(browser, url)
        samples["raw cold"].append(time.perf_counter() - started)
        await browser.close()
        await playwright.stop()

        runtime = BrowserRuntime(outbound=Outbound(allow_source=lambda: allowed), data_dir=data_dir)
        started = time.perf_counter()
        await ToolDriver(runtime).ok("browser_open", url=url)
        samples["aleph cold"].append(time.perf_counter() - started)
        await asyncio.to_thread(runtime.close)

    playwright = await async_playwright().start()
    browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=list(LAUNCH_ARGS), headless=True)
    runtime = BrowserRuntime(outbound=Outbound(allow_source=lambda: allowed), data_dir=data_dir)
    try:
        await ToolDriver(runtime, session_key="first").ok("browser_open", url=url)
        for n in range(WARM):
            started = time.perf_counter()
            context, _ = await raw_open(browser, url)
            samples["raw warm"].append(time.perf_counter() - started)
            await context.close()
            driver = ToolDriver(runtime, session_key=f"warm-{n}")
            started = time.perf_counter()
            await driver.ok("browser_open", url=url)
            samples["aleph warm"].append(time.perf_counter() - started)
            await driver.ok("browser_session", action="close")

        _, page = await raw_open(browser, url)
        driver = ToolDriver(runtime, session_key="trips")
        await driver.ok("browser_open", url=url)
        for _ in range(5):
            await raw_round_trip(page)
            await aleph_round_trip(driver)
        # Interleaved, so both see the same moment's load on a shared machine.
        for _ in range(ROUND_TRIPS):
            started = time.perf_counter()
            await raw_round_trip(page)
            samples["raw trip"].append(time.perf_counter() - started)
            started = time.perf_counter()
            await aleph_round_trip(driver)
            samples["aleph trip"].append(time.perf_counter() - started)
        clicked = (await driver.ok("browser_snapshot"))["snapshot"]
        assert f"Clicked {ROUND_TRIPS + 5} time(s)" in clicked, clicked
    finally:
        await browser.close()
        await playwright.stop()
        await asyncio.to_thread(runtime.close)
    return samples


def main() -> int:
    if not shutil.which(CHROMIUM):
        print("## Browser tools\n\nskipped: Debian's chromium is not installed")
        return 0
    with PageServer(PAGES) as server, tempfile.TemporaryDirectory() as data_dir:
        samples = asyncio.run(measure(server, Path(data_dir)))
    med = {key: median(values) for key, values in samples.items()}
    rows = [
        [
            "snapshot + click round trip (local page)",
            millis(med["raw trip"]),
            millis(med["aleph trip"]),
            millis(percentile(samples["aleph trip"], 0.95)),
            f"{med['aleph trip'] / med['raw trip']:.2f}×",
        ],
        [
            "cold start: driver + Chromium + context + page",
            millis(med["raw cold"]),
            millis(med["aleph cold"]),
            millis(max(samples["aleph cold"])),
            f"{med['aleph cold'] / med['raw cold']:.2f}×",
        ],
        [
            "warm start: new context + page on a running browser",
            millis(med["raw warm"]),
            millis(med["aleph warm"]),
            millis(max(samples["aleph warm"])),
            f"{med['aleph warm'] / med['raw warm']:.2f}×",
        ],
    ]
    print("## Browser tools: round trip and start-up (Debian Chromium, page on 127.0.0.1)\n")
    print(
        f"Medians; {ROUND_TRIPS} round trips interleaved with the plain-Playwright baseline, {COLD} cold starts, "
        f"{WARM} warm starts. The Aleph column goes through the tools and the runtime's own loop thread, with every "
        "request fulfilled through the SSRF engine; the baseline is Playwright alone on a browser of its own.\n"
    )
    print(table(["measure", "Playwright alone", "Aleph tools", "Aleph worst/p95", "ratio"], rows))
    print()
    print(
        target(med["aleph trip"] <= 0.25, f"snapshot + click round trip median ≤ 250 ms: {millis(med['aleph trip'])}")
    )
    print(
        target(
            med["aleph trip"] <= 3 * med["raw trip"] + 0.05,
            f"round trip ≤ 3× plain Playwright + 50 ms: {med['aleph trip'] / med['raw trip']:.2f}× "
            f"({millis(med['aleph trip'] - med['raw trip'])} added)",
        )
    )
    print(
        target(
            med["aleph warm"] <= med["aleph cold"] / 3,
            f"a warm start costs ≤ 1/3 of a cold start: {millis(med['aleph warm'])} against "
            f"{millis(med['aleph cold'])} ({med['aleph cold'] / med['aleph warm']:.1f}× faster)",
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
