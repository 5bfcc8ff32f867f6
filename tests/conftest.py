"""The fixed cast every suite shares: admin, an operator of `ops`, an auditor, an outsider; agents builder and scout."""

import contextlib
import os
from types import SimpleNamespace

import pytest
from rest_framework.test import APIClient

from tools_app.models import Channel, ChannelKind
from tools_app.policy_store import policy_forget
from tools_app.services import agent_create, user_create

SERVICES_REQUIRED = os.environ.get("ALEPH_REQUIRE_SERVICES") == "1"


@pytest.fixture(autouse=True)
def _fresh_policy_cache():
    policy_forget()
    yield
    policy_forget()


def make_cast():
    people = {}
    for name, role in (("admin", "admin"), ("olive", "operator"), ("otto", "operator"), ("audrey", "auditor")):
        user, token = user_create(name=name, role=role, password=f"{name}-password")
        people[name] = SimpleNamespace(user=user, token=token, password=f"{name}-password")
    outsider, outsider_token = user_create(name="oscar", role="operator", password="oscar-password")
    outsider.groups.clear()
    people["oscar"] = SimpleNamespace(user=outsider, token=outsider_token, password="oscar-password")
    agents = {}
    for name in ("builder", "scout"):
        agent, token = agent_create(name=name)
        agents[name] = SimpleNamespace(agent=agent, token=token)
    ops = Channel.objects.create(name="ops", kind=ChannelKind.WEB)
    ops.operators.add(people["olive"].user)
    lab = Channel.objects.create(name="lab", kind=ChannelKind.WEB)
    lab.operators.add(people["otto"].user)
    nightly = Channel.objects.create(name="nightly", kind=ChannelKind.CRON, unattended=True)
    return SimpleNamespace(
        admin=people["admin"],
        operator=people["olive"],
        other_operator=people["otto"],
        auditor=people["audrey"],
        outsider=people["oscar"],
        builder=agents["builder"],
        scout=agents["scout"],
        ops=ops,
        lab=lab,
        nightly=nightly,
    )


@pytest.fixture
def cast(db):
    return make_cast()


def client_for(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.fixture
def as_builder(cast):
    return client_for(cast.builder.token)


@pytest.fixture
def as_scout(cast):
    return client_for(cast.scout.token)


def _child_database():
    """In the forked daphne: the settings already name the test database; open connections of its own."""
    from concurrent.futures import ThreadPoolExecutor

    from asgiref.sync import SyncToAsync
    from django.conf import settings
    from django.db import connections

    connections.close_all()
    settings.ALLOWED_HOSTS = ["*"]
    # A fork copies asgiref's one-thread executor but not its thread: once the parent has used it (any async test
    # touching the ORM), every thread-sensitive sync_to_async in the child would wait forever.
    SyncToAsync.single_thread_executor = ThreadPoolExecutor(max_workers=1)


@pytest.fixture
def daphne_server(transactional_db):
    """A real daphne serving this project (HTTP and websockets) on a free port of 127.0.0.1, on the test database."""
    from functools import partial

    from channels.testing.live import make_application
    from daphne.testing import DaphneProcess
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
    from django.db import connections

    connections.close_all()
    process = DaphneProcess(
        "127.0.0.1", partial(make_application, static_wrapper=ASGIStaticFilesHandler), setup=_child_database
    )
    process.start()
    while not process.ready.wait(timeout=1):
        if not process.is_alive():
            raise RuntimeError(f"daphne did not start: {process.errors.get(timeout=1)}")
    port = process.port.value
    yield SimpleNamespace(url=f"http://127.0.0.1:{port}", ws_url=f"ws://127.0.0.1:{port}", port=port)
    process.terminate()
    process.join(timeout=10)


@contextlib.contextmanager
def chromium():
    """Debian's Chromium under Playwright, launched with the browser runtime's own executable and flags. Open it only
    after the test's rows are written: Playwright's sync API runs an event loop, where Django's ORM refuses."""
    from playwright.sync_api import sync_playwright

    from tools_app.browser.runtime import CHROMIUM, LAUNCH_ARGS

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=list(LAUNCH_ARGS), headless=True)
        try:
            yield browser
        finally:
            browser.close()
