"""The outbound door's added time per request: guarded clients against a plain httpx client, same local server."""

from __future__ import annotations

import asyncio
import gc
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import django

django.setup()

import httpx  # noqa: E402

from bench.report import median, micros, percentile, table, target  # noqa: E402
from tools_app.builtin.web import WebFetch  # noqa: E402
from tools_app.chokepoint.base import ToolContext  # noqa: E402
from tools_app.net import AllowList, Outbound  # noqa: E402
from tools_app.net.testing import ScriptedResolver  # noqa: E402

CYCLES = 1200
CTX = ToolContext(call_id="b", agent_id=1, agent_name="bench", channel_name="bench", session_key=None, attended=True)

# A keep-alive HTTP/1.1 server in its own process, so its work does not share this process's GIL.
SERVER = r"""
import asyncio, sys
BODY = b'{"ok": true}'
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            writer.write(RESPONSE)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 0, backlog=512)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""

Send = Callable[[], Awaitable[None]]


async def timed(send: Send, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await send()
        samples.append(time.perf_counter() - started)
    return samples


async def scenarios(port: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    literal = f"http://127.0.0.1:{port}/"
    named = f"http://bench.test:{port}/"
    by_system = f"http://localhost:{port}/"
    allow = AllowList.parse([f"127.0.0.1:{port}", f"bench.test:{port}", f"localhost:{port}"])
    outbound = Outbound(allow_source=lambda: allow, resolver=ScriptedResolver({"bench.test": ["127.0.0.1"]}))
    plain = httpx.AsyncClient(trust_env=False)
    guarded = outbound.client(allow=allow)
    guarded_system = Outbound(allow_source=lambda: allow).client(allow=allow)
    tool = WebFetch(outbound=outbound)
    fetch_args = tool.parse({"url": literal})

    async def plain_get():
        (await plain.get(literal)).raise_for_status()

    async def guarded_get():
        (await guarded.get(literal)).raise_for_status()

    async def guarded_named_get():
        (await guarded.get(named)).raise_for_status()

    async def plain_localhost_get():
        (await plain.get(by_system)).raise_for_status()

    async def guarded_system_get():
        (await guarded_system.get(by_system)).raise_for_status()

    async def plain_fresh():
        async with httpx.AsyncClient(trust_env=False, verify=outbound.ssl_context) as client:
            (await client.get(literal)).raise_for_status()

    async def guarded_fresh():
        async with outbound.client(allow=allow) as client:
            (await client.get(literal)).raise_for_status()

    async def web_fetch_call():
        result = await tool.run(fetch_args, CTX)
        assert result.success, result.error

    sends = {
        "plain httpx, keep-alive": plain_get,
        "guarded, keep-alive, IP literal": guarded_get,
        "guarded, keep-alive, vetted name (scripted resolver)": guarded_named_get,
        "plain httpx, keep-alive, localhost (resolved per connection)": plain_localhost_get,
        "guarded, keep-alive, localhost (system resolver)": guarded_system_get,
        "plain httpx, new client per request": plain_fresh,
        "guarded, new client per request": guarded_fresh,
        "web_fetch tool call (new client, JSON output)": web_fetch_call,
    }
    wall: dict[str, list[float]] = {name: [] for name in sends}
    cpu: dict[str, list[float]] = {name: [] for name in sends}
    for send in sends.values():
        await timed(send, 50)
    order = list(sends)
    shuffler = random.Random(7)
    gc.disable()
    try:
        for _ in range(CYCLES):
            shuffler.shuffle(order)  # each cycle runs every scenario once, in a fresh order: no position favoured
            for name in order:
                started, started_cpu = time.perf_counter(), time.process_time()
                await sends[name]()
                wall[name].append(time.perf_counter() - started)
                cpu[name].append(time.process_time() - started_cpu)
    finally:
        gc.enable()
    for client in (plain, guarded, guarded_system):
        await client.aclose()
    return wall, cpu


def paired(values: list[float], baseline: list[float]) -> float:
    """The median of per-cycle differences: both requests ran moments apart, so load swings cancel out."""
    return median([a - b for a, b in zip(values, baseline, strict=True)])


def main() -> int:
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        wall, cpu = asyncio.run(scenarios(port))
    finally:
        server.terminate()
        server.wait(timeout=10)
    baselines = {
        "keep-alive": "plain httpx, keep-alive",
        "localhost": "plain httpx, keep-alive, localhost (resolved per connection)",
        "fresh": "plain httpx, new client per request",
    }

    def baseline_of(name: str) -> str:
        if "localhost" in name:
            return baselines["localhost"]
        return baselines["fresh"] if "new client" in name or "web_fetch" in name else baselines["keep-alive"]

    rows = []
    added: dict[str, float] = {}
    for name in wall:
        base = baseline_of(name)
        added[name] = paired(wall[name], wall[base])
        rows.append(
            [
                name,
                micros(median(wall[name])),
                micros(percentile(wall[name], 0.9)),
                micros(added[name]),
                micros(median(cpu[name])),
                micros(paired(cpu[name], cpu[base])),
            ]
        )
    print("## SSRF engine: added time per request (local keep-alive server, same run)\n")
    print(
        f"{CYCLES} cycles; each cycle sends one GET per scenario, in a shuffled order, to a one-process asyncio server "
        "on 127.0.0.1. 'added' is the median of per-cycle differences against the plain httpx row of the same kind "
        "(wall clock; CPU is this process's CPU time, which other processes' load does not inflate).\n"
    )
    print(table(["scenario", "median", "p90", "added (wall)", "CPU", "added (CPU)"], rows))
    print()
    for name, label in (
        ("guarded, keep-alive, IP literal", "keep-alive, IP literal"),
        ("guarded, keep-alive, vetted name (scripted resolver)", "keep-alive, vetted name"),
        ("guarded, keep-alive, localhost (system resolver)", "keep-alive, system resolver"),
        ("guarded, new client per request", "a new client each time"),
    ):
        print(target(added[name] <= 1e-3, f"added ≤ 1 ms per request ({label}): {micros(added[name])}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
