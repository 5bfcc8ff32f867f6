"""A bridged MCP call through the chokepoint vs the same MCP server called directly with the SDK client, one run."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEER = ROOT / "tests" / "mcp_peers" / "peer.py"
WARMUP = 30
PER_ROUND = 40
ROUNDS = 10
TARGET_MS = 2.0


def setup_django(data_dir: str) -> None:
    # A database of its own: the bridged path writes its event-log rows there, never into a shared one.
    os.environ["ALEPH_DATA_DIR"] = data_dir
    os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def seed(http_url: str) -> int:
    from tools_app.models import Channel, ChannelKind, McpServer
    from tools_app.services import agent_create

    agent, _ = agent_create(name="bench")
    Channel.objects.create(name="bench", kind=ChannelKind.API)
    McpServer.objects.create(name="peer", transport="stdio", command=sys.executable, args=[str(PEER), "stdio"])
    McpServer.objects.create(name="web", transport="http", url=http_url, network_allow=["127.0.0.1"])
    return agent.id


async def timed(call, count: int) -> list[float]:
    samples = []
    for i in range(count):
        started = time.perf_counter()
        await call(i)
        samples.append(time.perf_counter() - started)
    return samples


async def measure(agent_id: int, http_url: str) -> dict[str, list[float]]:
    from asgiref.sync import sync_to_async
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    from tools_app.gateway import build_request_tool_service, gateway
    from tools_app.mcp.wiring import mcp_start
    from tools_app.policy_store import current_policy

    wired = await sync_to_async(gateway)()  # the real wiring: desk, ledger recorder, floors, the MCP manager
    manager = mcp_start(wired)
    await manager.settled()
    for row in manager.snapshot():
        if row["status"] != "connected":
            raise RuntimeError(f"{row['name']} did not connect: {row['last_error']}")
    service = await sync_to_async(
        lambda: build_request_tool_service(policy=current_policy(), agent_id=agent_id, channel_name="bench")
    )()

    def chokepoint(name):
        async def call(i):
            outcome = await service.execute(name, {"a": 1, "b": i})
            assert outcome.status == "succeeded", outcome.as_dict()

        return call

    def bridge(name):
        tool = manager.get(name)

        async def call(i):
            result = await tool.run({"a": 1, "b": i}, None)
            assert result.success, result

        return call

    def direct(client):
        async def call(i):
            result = await client.call_tool("add", {"a": 1, "b": i})
            assert not result.is_error

        return call

    samples: dict[str, list[float]] = {}
    with open(os.devnull, "w") as quiet:
        params = StdioServerParameters(command=sys.executable, args=[str(PEER), "stdio"])
        async with (
            Client(stdio_client(params, errlog=quiet), cache=None) as stdio,
            Client(http_url, cache=None) as http,
        ):
            paths = {
                "stdio": {
                    "direct (SDK client)": direct(stdio),
                    "bridge hop (tool.run)": bridge("peer__add"),
                    "through the chokepoint": chokepoint("peer__add"),
                },
                "http": {
                    "direct (SDK client)": direct(http),
                    "bridge hop (tool.run)": bridge("web__add"),
                    "through the chokepoint": chokepoint("web__add"),
                },
            }
            for transport, calls in paths.items():
                per_round = PER_ROUND if transport == "stdio" else PER_ROUND // 2
                for call in calls.values():
                    await timed(call, WARMUP // (1 if transport == "stdio" else 2))
                for round_ in range(ROUNDS):
                    # Alternate the order each round, so drift on a busy machine falls on both sides alike.
                    order = list(calls) if round_ % 2 == 0 else list(reversed(calls))
                    for name in order:
                        samples.setdefault(f"{transport}: {name}", []).extend(await timed(calls[name], per_round))
    await manager.stop()
    return samples


def main() -> int:
    import subprocess

    data_dir = tempfile.mkdtemp(prefix="aleph-bench-mcp-")
    peer = subprocess.Popen(
        [sys.executable, str(PEER), "http"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        http_url = f"http://127.0.0.1:{int(peer.stdout.readline())}/mcp"
        setup_django(data_dir)
        from bench.report import median, millis, percentile, table, target

        agent_id = seed(http_url)
        samples = asyncio.run(measure(agent_id, http_url))
    finally:
        peer.kill()
        shutil.rmtree(data_dir, ignore_errors=True)
    rows = [
        [name, millis(median(values)), millis(percentile(values, 0.95)), str(len(values))]
        for name, values in samples.items()
    ]
    print("## MCP bridge: a call through the chokepoint vs the SDK client calling the same server\n")
    print(
        "The same MCPServer script (`tests/mcp_peers/peer.py`, tool `add`), a process per client. Bridge hop: the "
        "bridged tool's `run` (the manager's session; HTTP through the outbound guard). Through the chokepoint: "
        "`ScopedToolService.execute` on the real wiring (policy decision, event-log row, ledger recorder, then the "
        f"hop). Sequential calls, {ROUNDS} alternating rounds; medians compared within the run.\n"
    )
    print(table(["path", "median", "p95", "calls"], rows))
    print()
    for transport in ("stdio", "http"):
        base = median(samples[f"{transport}: direct (SDK client)"])
        hop = median(samples[f"{transport}: bridge hop (tool.run)"]) - base
        full = median(samples[f"{transport}: through the chokepoint"]) - base
        print(
            target(
                full <= TARGET_MS / 1e3,
                f"{transport}: a bridged call through the chokepoint adds {millis(full)} (≤ 2 ms)",
            )
        )
        print(f"  - of which the bridge hop itself: {millis(hop)}; the rest is the chokepoint's decision and records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
