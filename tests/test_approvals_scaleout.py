"""Scale-out: two daphne processes on one PostgreSQL and one Redis; a call parked on A is released from B."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from tests.conftest import SERVICES_REQUIRED, make_cast

ROOT = Path(__file__).resolve().parent.parent
MISSING = [name for name in ("DATABASE_URL", "REDIS_URL") if not os.environ.get(name)]
MISSING_REASON = f"{' and '.join(MISSING)} not set: the two-process test needs PostgreSQL and Redis"
pytestmark = [
    pytest.mark.services,
    pytest.mark.skipif(bool(MISSING) and not SERVICES_REQUIRED, reason=MISSING_REASON),
    pytest.mark.django_db(transaction=True),
]


def shared_database_url() -> str:
    """The URL of the test database this run created, for the daphne processes to share."""
    db = connection.settings_dict
    credentials = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{credentials}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


class Daphne:
    """A daphne subprocess serving this project on a socket bound here first, so the port is known and free."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"daphne-{name}.log"
        self.log = self.log_path.open("wb")
        fd = self.listener.fileno()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "--fd", str(fd), "aleph_site.asgi:application"],
            cwd=ROOT,
            env=env,
            pass_fds=(fd,),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"daphne exited: {self.tail()}")
            try:
                if httpx.get(f"{self.url}/api/v1/health/", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"daphne not ready within {timeout}s: {self.tail()}")

    def tail(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.listener.close()
        self.log.close()


@pytest.fixture
def two_servers(tmp_path):
    if MISSING:
        pytest.fail(f"{MISSING_REASON} (ALEPH_REQUIRE_SERVICES=1)")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": shared_database_url(),
        "REDIS_URL": os.environ["REDIS_URL"],
        "ALEPH_DATA_DIR": str(settings.DATA_DIR),
    }
    servers = [Daphne("a", env, tmp_path), Daphne("b", env, tmp_path)]
    try:
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_call_parked_on_a_is_released_by_a_decision_posted_to_b(two_servers):
    from websockets.sync.client import connect

    a, b = two_servers
    cast = make_cast()
    browser = Client()
    browser.force_login(cast.operator.user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}"

    with connect(
        f"ws://127.0.0.1:{b.port}/ws/approvals/",
        origin=b.url,
        additional_headers={"Cookie": cookie},
        proxy=None,
        open_timeout=10,
    ) as feed:
        assert json.loads(feed.recv(timeout=10))["type"] == "approval.snapshot"
        parked = httpx.post(
            f"{a.url}/api/v1/calls/",
            json={"tool": "note_write", "input": {"text": "scale out"}, "channel": "ops", "wait": 0},
            headers=bearer(cast.builder.token),
            timeout=10,
        )
        assert parked.status_code == 202, parked.text
        call_id = parked.json()["id"]

        # The card reaches an operator connected to B through Redis.
        card = json.loads(feed.recv(timeout=10))
        assert card["type"] == "approval.requested", (card, a.tail())
        assert card["request"]["call"] == call_id

        listed = httpx.get(
            f"{b.url}/api/v1/approvals/?status=pending", headers=bearer(cast.operator.token), timeout=10
        ).json()
        assert [c["call"] for c in listed] == [call_id]

        started = time.monotonic()
        decided = httpx.post(
            f"{b.url}/api/v1/approvals/{card['request']['id']}/decide/",
            json={"decision": "approve", "scope": "once"},
            headers=bearer(cast.operator.token),
            timeout=10,
        )
        assert decided.status_code == 200, decided.text
        result = httpx.get(
            f"{a.url}/api/v1/calls/{call_id}/?wait=10", headers=bearer(cast.builder.token), timeout=20
        ).json()
        released_in = time.monotonic() - started
        assert result["status"] == "succeeded", (result, a.tail())
        assert result["decision"]["decided_by"] == "operator"
        assert result["decision"]["approval"] == card["request"]["id"]
        # Released by the wake-up through Redis, well before A's 1.5 s database poll would have noticed.
        assert released_in < 1.4, released_in

        resolution = json.loads(feed.recv(timeout=10))
        assert resolution["type"] == "approval.resolved"
        assert resolution["resolution"]["decided_by"] == "olive"

        again = httpx.post(
            f"{a.url}/api/v1/approvals/{card['request']['id']}/decide/",
            json={"decision": "deny"},
            headers=bearer(cast.admin.token),
            timeout=10,
        )
        assert again.status_code == 409
        assert again.json()["error"]["message"] == "Already decided by olive (approved)."
