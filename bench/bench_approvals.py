"""Live approvals: card fan-out to 10/100/500 operator sockets against a bare `websockets` broadcast, and the cost
of 200 parked calls to GET tools/ against an idle twin process sampled in turn — one run."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLEETS = ((500, 8), (100, 30), (10, 20))  # (sockets, rounds); memory is read while the 500 connect
PARKED = 200
GET_WARMUP = 30
GET_SAMPLES = 300
CONNECT_BATCH = 50
ROUND_TIMEOUT_S = 20


# -- small report helpers -------------------------------------------------------------------------


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[max(1, min(len(ordered), round(fraction * len(ordered)))) - 1]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def target(passed: bool, text: str) -> str:
    return f"- {'PASS' if passed else 'FAIL'}: {text}"


# -- servers ------------------------------------------------------------------------------------


def listening_socket() -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    return listener


def spawn(args: list[str], env: dict[str, str], listener: socket.socket, log: Path) -> subprocess.Popen:
    with log.open("w") as handle:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=env,
            pass_fds=(listener.fileno(),),
            stdout=handle,
            stderr=subprocess.STDOUT,
        )


class Server:
    """A daphne subprocess on a socket bound here first, so its port is known and nobody else's."""

    def __init__(self, name: str, env: dict[str, str], data_dir: Path):
        self.listener = listening_socket()
        self.port = self.listener.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        args = ["-m", "daphne", "--fd", str(self.listener.fileno()), "aleph_site.asgi:application"]
        self.process = spawn(args, env, self.listener, data_dir / f"daphne-{name}.log")

    def wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base}/api/v1/health/", timeout=2, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"daphne on {self.base} did not start")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self.listener.close()


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def bare_server(fd: int) -> None:
    """The baseline: a bare `websockets` server that broadcasts one text frame to every client on "go"."""
    from websockets.asyncio.server import broadcast, serve

    clients = set()

    async def handler(connection):
        clients.add(connection)
        try:
            async for message in connection:
                if message.startswith("go "):
                    card = json.loads(message[3:])
                    broadcast(clients, json.dumps({"type": "bare.card", "sent_at": time.time(), "request": card}))
        finally:
            clients.discard(connection)

    listener = socket.socket(fileno=fd)
    async with serve(handler, sock=listener, compression=None, ping_interval=None, max_queue=None):
        await asyncio.Future()


# -- the operator fleet -------------------------------------------------------------------------


class Fleet:
    """N websocket clients; each stamps the arrival time of the frame that carries the current round's marker."""

    def __init__(self):
        self.connections = []
        self.readers = []
        self.marker: str | None = None
        self.arrivals: list[float] = []
        self.first_text: str | None = None
        self.done = asyncio.Event()

    async def open(self, count: int, uri: str, origin: str | None, headers: dict[str, str], greeting: str | None):
        from websockets.asyncio.client import connect

        async def one():
            connection = await connect(
                uri,
                origin=origin,
                additional_headers=headers,
                proxy=None,
                compression=None,
                ping_interval=None,
                open_timeout=60,
                max_queue=None,
            )
            if greeting is not None:
                assert greeting in await connection.recv()
            return connection

        for start in range(0, count, CONNECT_BATCH):
            batch = await asyncio.gather(*(one() for _ in range(min(CONNECT_BATCH, count - start))))
            self.connections += batch
            self.readers += [asyncio.create_task(self._read(c)) for c in batch]

    async def _read(self, connection):
        try:
            async for text in connection:
                arrived = time.time()
                if self.marker is not None and self.marker in text:
                    if self.first_text is None:
                        self.first_text = text
                    self.arrivals.append(arrived)
                    if len(self.arrivals) == len(self.connections):
                        self.done.set()
        except Exception:  # a closed socket ends its reader; the round's timeout reports a shortfall
            return

    def expect(self, marker: str) -> None:
        self.marker, self.arrivals, self.first_text = marker, [], None
        self.done = asyncio.Event()

    async def wait_all(self) -> float:
        await asyncio.wait_for(self.done.wait(), ROUND_TIMEOUT_S)
        return max(self.arrivals)

    async def close(self):
        for reader in self.readers:
            reader.cancel()
        await asyncio.gather(*(c.close() for c in self.connections), return_exceptions=True)
        self.connections, self.readers = [], []


# -- the benchmark ------------------------------------------------------------------------------


def prepare(data_dir: Path) -> dict:
    """A fresh SQLite database with an operator, an admin and an agent, and the operator's browser session."""
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test import Client

    from tools_app.models import Channel
    from tools_app.services import agent_create, user_create

    call_command("migrate", verbosity=0)
    olive, _ = user_create(name="olive", role="operator", password="olive-password")
    _, admin_token = user_create(name="admin", role="admin", password="admin-password")
    _, agent_token = agent_create(name="builder")
    ops = Channel.objects.create(name="ops")
    ops.operators.add(olive)
    browser = Client()
    browser.force_login(olive)
    cookie = f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}"
    layer = settings.CHANNEL_LAYERS["default"]["BACKEND"].rsplit(".", 1)[-1]
    return {"cookie": cookie, "admin": admin_token, "agent": agent_token, "layer": layer}


async def park(http, base: str, agent: str, text: str) -> dict:
    response = await http.post(
        f"{base}/api/v1/calls/",
        json={"tool": "note_write", "input": {"text": text}, "channel": "ops", "wait": 0},
        headers={"Authorization": f"Bearer {agent}"},
    )
    assert response.status_code == 202, response.text
    return response.json()


async def fan_out(http, base, aleph, bare_uri, setup, rounds) -> dict:
    bare = Fleet()
    await bare.open(len(aleph.connections), bare_uri, None, {}, None)
    aleph_samples, bare_samples, card = [], [], None
    for index in range(rounds):
        aleph.expect('"approval.requested"')
        await park(http, base, setup["agent"], f"round {index} of {len(aleph.connections)}")
        last = await aleph.wait_all()
        card = json.loads(aleph.first_text)["request"]
        aleph_samples.append(last - datetime.fromisoformat(card["created_at"]).timestamp())
        aleph.expect('"approval.resolved"')
        decided = await http.post(
            f"{base}/api/v1/approvals/{card['id']}/decide/",
            json={"decision": "deny", "reason": "benchmark"},
            headers={"Authorization": f"Bearer {setup['admin']}"},
        )
        assert decided.status_code == 200, decided.text
        await aleph.wait_all()

        bare.expect('"bare.card"')
        await bare.connections[0].send("go " + json.dumps(card))
        last = await bare.wait_all()
        bare_samples.append(last - json.loads(bare.first_text)["sent_at"])
    await bare.close()
    return {"aleph": aleph_samples, "bare": bare_samples}


async def pending_count(http, base: str, admin: str) -> int:
    """A 202 answers once the call parks, a moment before its request row exists: wait for the rows."""
    count = 0
    for _ in range(50):
        listed = await http.get(
            f"{base}/api/v1/approvals/?status=pending", headers={"Authorization": f"Bearer {admin}"}
        )
        count = len(listed.json())
        if count >= PARKED:
            break
        await asyncio.sleep(0.1)
    return count


async def get_latencies(http, idle_base: str, parked_base: str, agent: str) -> tuple[list[float], list[float]]:
    """The same request to the idle and the parked process in turn, so both see the same machine at the same time."""
    headers = {"Authorization": f"Bearer {agent}"}
    samples: dict[str, list[float]] = {idle_base: [], parked_base: []}
    for index in range(GET_WARMUP + GET_SAMPLES):
        for base in (idle_base, parked_base) if index % 2 else (parked_base, idle_base):
            started = time.perf_counter()
            response = await http.get(f"{base}/api/v1/tools/?channel=ops", headers=headers)
            elapsed = time.perf_counter() - started
            assert response.status_code == 200, response.text
            if index >= GET_WARMUP:
                samples[base].append(elapsed)
    return samples[idle_base], samples[parked_base]


async def measure(cards: Server, idle: Server, parked: Server, bare_port: int, setup: dict) -> dict:
    import httpx

    ws_uri, bare_uri = f"ws://127.0.0.1:{cards.port}/ws/approvals/", f"ws://127.0.0.1:{bare_port}/"
    operator = {"Cookie": setup["cookie"]}
    results: dict = {"fleets": {}}
    async with httpx.AsyncClient(timeout=60, trust_env=False) as http:
        for sockets, rounds in FLEETS:
            fleet = Fleet()
            await fleet.open(1, ws_uri, cards.base, operator, "approval.snapshot")
            await asyncio.sleep(0.5)
            before = rss_kb(cards.process.pid)
            await fleet.open(sockets - 1, ws_uri, cards.base, operator, "approval.snapshot")
            await asyncio.sleep(0.5)
            if "rss_kb" not in results:
                after = rss_kb(cards.process.pid)
                results["rss_kb"] = (before, after, sockets)
            results["fleets"][sockets] = await fan_out(http, cards.base, fleet, bare_uri, setup, rounds)
            await fleet.close()

        for start in range(0, PARKED, 10):
            batch = range(start, start + 10)
            await asyncio.gather(*(park(http, parked.base, setup["agent"], f"parked {n}") for n in batch))
        results["parked_count"] = await pending_count(http, parked.base, setup["admin"])
        results["idle"], results["parked"] = await get_latencies(http, idle.base, parked.base, setup["agent"])
    return results


def report(results: dict, layer: str) -> None:
    print("## Approvals: live cards to operator sockets, and parked calls\n")
    print(f"daphne on SQLite, channel layer `{layer}`. Latency = call parked (request row stamped) → card received by")
    print("the last connected socket; bare = `websockets.broadcast` from a bare server to as many clients, same run.\n")
    rows = []
    for sockets, samples in sorted(results["fleets"].items()):
        aleph, bare = samples["aleph"], samples["bare"]
        rows.append(
            [
                str(sockets),
                str(len(aleph)),
                ms(statistics.median(aleph)),
                ms(percentile(aleph, 0.9)),
                ms(statistics.median(bare)),
                ms(percentile(bare, 0.9)),
                f"{percentile(aleph, 0.9) / percentile(bare, 0.9):.1f}×",
            ]
        )
    print(table(["sockets", "rounds", "Aleph p50", "Aleph p90", "bare p50", "bare p90", "p90 ratio"], rows))
    before, after, sockets = results["rss_kb"]
    per_socket = (after - before) / (sockets - 1)
    print(
        f"\nMemory: daphne RSS {before / 1024:.1f} MiB with 1 socket, {after / 1024:.1f} MiB with {sockets}: ", end=""
    )
    print(f"{per_socket:.1f} KB per connection.\n")
    print("GET tools/ sampled in turn from two twin daphne processes, one idle and one holding the parked calls:\n")
    idle, parked = results["idle"], results["parked"]
    print(
        table(
            ["GET tools/", "requests", "p50", "p90", "p99"],
            [
                [
                    "idle",
                    str(len(idle)),
                    ms(statistics.median(idle)),
                    ms(percentile(idle, 0.9)),
                    ms(percentile(idle, 0.99)),
                ],
                [
                    f"{results['parked_count']} calls parked",
                    str(len(parked)),
                    ms(statistics.median(parked)),
                    ms(percentile(parked, 0.9)),
                    ms(percentile(parked, 0.99)),
                ],
            ],
        )
    )
    at_100 = results["fleets"][100]
    p90, bare_p90 = percentile(at_100["aleph"], 0.9), percentile(at_100["bare"], 0.9)
    ratio_parked = percentile(parked, 0.99) / percentile(idle, 0.99)
    print()
    print(target(p90 <= 0.060, f"card to the last of 100 sockets p90 ≤ 60 ms: {ms(p90)}"))
    print(target(p90 <= 5 * bare_p90, f"p90 ≤ 5× the bare broadcast at 100: {p90 / bare_p90:.1f}× ({ms(bare_p90)})"))
    print(target(per_socket <= 64, f"memory per connection ≤ 64 KB: {per_socket:.1f} KB"))
    print(
        target(
            ratio_parked <= 2 and results["parked_count"] == PARKED,
            f"p99 of GET tools/ with {results['parked_count']} calls parked ≤ 2× idle: {ratio_parked:.2f}×",
        )
    )


def main() -> int:
    data_dir = Path(tempfile.mkdtemp(prefix="approvals-", dir=ROOT / "var"))
    os.environ["ALEPH_DATA_DIR"] = str(data_dir)
    # A private SQLite database: the benchmark never writes to a database someone named.
    os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    setup = prepare(data_dir)
    env = {**os.environ}
    servers = [Server(name, env, data_dir) for name in ("cards", "idle", "parked")]
    bare_listener = listening_socket()
    bare = spawn(
        ["-m", "bench.bench_approvals", "--bare", str(bare_listener.fileno())],
        env,
        bare_listener,
        data_dir / "bare.log",
    )
    try:
        for server in servers:
            server.wait_ready()
        results = asyncio.run(measure(*servers, bare_listener.getsockname()[1], setup))
        report(results, setup["layer"])
    finally:
        for server in servers:
            server.stop()
        bare.terminate()
        bare.wait(timeout=10)
        bare_listener.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--bare":
        asyncio.run(bare_server(int(sys.argv[2])))
    else:
        sys.exit(main())
