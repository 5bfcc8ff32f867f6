"""POST /api/v1/calls/ for an allowed read-only tool against a bare DRF view writing one row, one daphne, one run."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.report import median, millis, percentile, table, target

ROOT = Path(__file__).resolve().parent.parent
CONCURRENCY = 4
WARMUP = 40
PER_ROUND = 60
ROUNDS = 12
ROUND_TIMEOUT_S = 60
POLICY = """
[policies]
exec_tier = "ask"

[policies.tool_permissions]
"note_search" = "allow"

[[channels]]
name = "bench"
kind = "api"
"""
CALL = {"tool": "note_search", "input": {"query": "alpha"}, "channel": "bench"}


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def server_start(env: dict[str, str], log: Path) -> tuple[subprocess.Popen, int]:
    """daphne on a socket this process bound to a free port of 127.0.0.1 and hands over, so no other can take it."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    with log.open("w") as handle:
        server = subprocess.Popen(
            [sys.executable, "-m", "daphne", "--fd", str(listener.fileno()), "aleph_site.asgi:application"],
            cwd=ROOT,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            pass_fds=[listener.fileno()],
        )
    listener.close()
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/api/v1/health/", timeout=30)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        server.kill()
        raise RuntimeError(f"daphne did not answer ({exc}):\n{log.read_text()}") from None
    return server, port


class Endpoint:
    def __init__(self, name: str, path: str, token: str, body: dict, check):
        self.name = name
        payload = json.dumps(body).encode()
        self.request = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode() + payload
        self.check = check
        self.latencies: list[float] = []
        self.elapsed = 0.0
        self.server_cpu = 0.0
        self.count = 0


class Connection:
    """One keep-alive HTTP/1.1 connection: a few lines of asyncio instead of an HTTP client library, so the load
    generator takes little of the CPU the server under test shares with it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer

    async def exchange(self, request: bytes) -> tuple[int, bytes]:
        self.writer.write(request)
        status_line = await self.reader.readline()
        if not status_line:
            raise RuntimeError("the server closed the connection")
        length, chunked = 0, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
        if not chunked:
            return int(status_line.split()[1]), await self.reader.readexactly(length)
        body = b""
        while size := int((await self.reader.readline()).split(b";")[0], 16):
            body += await self.reader.readexactly(size)
            await self.reader.readline()
        await self.reader.readline()
        return int(status_line.split()[1]), body


def call_ok(status: int, body: bytes) -> bool:
    if status != 200:
        return False
    payload = json.loads(body)
    return payload["status"] == "succeeded" and payload["decision"]["rule"] == "global:note_search"


def bare_ok(status: int, body: bytes) -> bool:
    return status == 201


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def burst(connections: list[Connection], endpoint: Endpoint, count: int, server_pid: int | None) -> None:
    """`count` requests spread over the connections; every response must be the expected success. With the
    server's pid the burst is measured: wall time, latencies and the server's CPU time."""
    remaining = count
    latencies: list[float] = []

    async def worker(connection: Connection) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            status, body = await connection.exchange(endpoint.request)
            latencies.append(time.perf_counter() - started)
            if not endpoint.check(status, body):
                raise RuntimeError(f"{endpoint.name}: unexpected {status} {body[:300]!r}")

    cpu = process_cpu(server_pid) if server_pid else 0.0
    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*map(worker, connections)), ROUND_TIMEOUT_S)
    if server_pid:
        endpoint.elapsed += time.perf_counter() - started
        endpoint.server_cpu += process_cpu(server_pid) - cpu
        endpoint.count += count
        endpoint.latencies += latencies


async def drive(port: int, server_pid: int, calls: Endpoint, bare: Endpoint, seed: Endpoint) -> None:
    connections = [Connection(*await asyncio.open_connection("127.0.0.1", port)) for _ in range(CONCURRENCY)]
    try:
        await burst(connections, seed, 20, None)
        for endpoint in (calls, bare):
            await burst(connections, endpoint, WARMUP, None)
        # ABBA order: a drift in machine load that grows or shrinks over the run hits both endpoints alike.
        for round_ in range(ROUNDS):
            order = (calls, bare) if round_ % 2 == 0 else (bare, calls)
            for endpoint in order:
                await burst(connections, endpoint, PER_ROUND, server_pid)
    finally:
        for connection in connections:
            connection.writer.close()


def main() -> int:
    load_before = os.getloadavg()[0]
    base = Path(os.environ.get("ALEPH_DATA_DIR") or ROOT / "var" / "bench")
    base.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="calls-", dir=base))
    env = {**os.environ, "ALEPH_DATA_DIR": str(data_dir), "DJANGO_SETTINGS_MODULE": "bench.settings_calls"}
    for name in ("DATABASE_URL", "REDIS_URL", "ALEPH_DEBUG"):
        env.pop(name, None)
    server = None
    try:
        manage(env, "migrate", "--noinput", "-v0")
        policy_file = data_dir / "aleph.toml"
        policy_file.write_text(POLICY)
        manage(env, "policy", "import", str(policy_file))
        searcher = json.loads(manage(env, "agent", "create", "bench-searcher", "--json"))["token"]
        writer = json.loads(manage(env, "agent", "create", "bench-writer", "--json"))["token"]
        server, port = server_start(env, data_dir / "daphne.log")
        calls = Endpoint("POST /api/v1/calls/ (note_search)", "/api/v1/calls/", searcher, CALL, call_ok)
        # The bare view writes for another agent, so note_search's table does not grow under it during the run.
        bare = Endpoint("bare DRF view, 1 INSERT", "/bench/bare/", writer, {"text": "bare write"}, bare_ok)
        seed = Endpoint("seed", "/bench/bare/", searcher, {"text": "alpha beta gamma"}, bare_ok)
        asyncio.run(drive(port, server.pid, calls, bare, seed))
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
        shutil.rmtree(data_dir, ignore_errors=True)
    rate = {e.name: e.count / e.elapsed for e in (calls, bare)}
    rows = [
        [
            e.name,
            e.count,
            f"{rate[e.name]:.1f}",
            millis(median(e.latencies)),
            millis(percentile(e.latencies, 0.99)),
            millis(e.server_cpu / e.count),
        ]
        for e in (calls, bare)
    ]
    ratio = rate[calls.name] / rate[bare.name]
    print("## Calls: POST /api/v1/calls/ against a bare DRF view (same daphne, same run)\n")
    print(
        f"One daphne process on SQLite (fresh data dir); {CONCURRENCY} keep-alive HTTP/1.1 connections from the "
        f"benchmark process (plain asyncio); {ROUNDS} rounds of {PER_ROUND} requests per endpoint in ABBA order "
        f"after {WARMUP} warm-up requests each. The call is note_search allowed by a global entry (a query, then "
        "the event-log INSERT); the bare view has the same Bearer authentication and INSERTs one Note.\n"
    )
    print(table(["endpoint", "requests", "requests/s", "median latency", "p99 latency", "server CPU/request"], rows))
    print()
    print(target(ratio >= 0.7, f"calls/ ≥ 70% of the bare view's requests/s: {ratio:.0%}"))
    cpu_ratio = (bare.server_cpu / bare.count) / (calls.server_cpu / calls.count)
    print(f"- (server CPU per request: the bare view's is {cpu_ratio:.0%} of calls/'s)")
    print(
        f"- (machine load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs; "
        "calls/ makes one more thread hop per request than the bare view, for note_search's query, and loses more when "
        "the machine is busy)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
