"""Every row of vectors/ssrf.tsv through the outbound door: a scripted resolver, a connector recording each dial."""

import re

import httpx
import pytest

from tests.shared import shared_path
from tools_app.builtin.web import WebFetch
from tools_app.chokepoint.base import ToolContext
from tools_app.net import AllowList, Guard, Outbound, SsrfBlocked
from tools_app.net.guard import RULES
from tools_app.net.testing import RecordingConnector, ScriptedResolver

CORPUS = shared_path("vectors", "ssrf.tsv")
CTX = ToolContext(call_id="c", agent_id=1, agent_name="builder", channel_name="ops", session_key=None, attended=True)


def corpus_rows() -> list[tuple[str, str, str]]:
    rows = []
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        verdict, url, note = line.split("\t")
        rows.append((verdict, url, note))
    return rows


ROWS = corpus_rows()
DNS = {
    name: addresses.split(",") for _, _, note in ROWS for name, addresses in re.findall(r"dns:([^=\s]+)=(\S+)", note)
}
DENIED = [(url, note) for verdict, url, note in ROWS if verdict == "D"]
ALLOWED = [(url, note) for verdict, url, note in ROWS if verdict == "A"]


def expected_dial(url: str) -> tuple[str, int]:
    """Where an allowed row must be dialed: the literal itself or the scripted answer, never anything else."""
    parsed = httpx.URL(url)
    host = parsed.host
    address = DNS[host][0] if host in DNS else host
    return address, parsed.port or (443 if parsed.scheme == "https" else 80)


def test_the_corpus_is_all_here():
    assert len(ROWS) == len(DENIED) + len(ALLOWED) == 50
    assert len(DENIED) == 47 and len(ALLOWED) == 3


def door(**kwargs):
    resolver = ScriptedResolver(DNS)
    connector = RecordingConnector()
    return Outbound(resolver=resolver, connector=connector, **kwargs), resolver, connector


@pytest.mark.parametrize(("url", "note"), DENIED, ids=[u for u, _ in DENIED])
async def test_denied_row_is_a_failed_web_fetch_with_no_connection(url, note):
    outbound, _, connector = door()
    tool = WebFetch(outbound=outbound)
    result = await tool.run(tool.parse({"url": url}), CTX)
    assert result.success is False
    assert result.error.code == "ssrf_blocked", result.error
    rule = result.error.detail["rule"]
    assert rule in RULES
    assert f"(rule {rule})" in result.error.message
    assert connector.attempts == []


@pytest.mark.parametrize(("url", "note"), DENIED, ids=[u for u, _ in DENIED])
async def test_denied_row_given_raw_to_the_outbound_client_never_connects(url, note):
    """Without web_fetch's strict parse first: httpx parses, the pinned transport judges what httpx would dial."""
    outbound, _, connector = door()
    async with outbound.client(allow=AllowList()) as client:
        with pytest.raises((SsrfBlocked, httpx.InvalidURL, UnicodeError)):
            await client.get(url)
    assert connector.attempts == []


@pytest.mark.parametrize(("url", "note"), DENIED, ids=[u for u, _ in DENIED])
async def test_denied_row_is_refused_by_the_guard(url, note):
    guard = Guard(resolver=ScriptedResolver(DNS))
    with pytest.raises(SsrfBlocked) as refused:
        await guard.vet(url)
    assert refused.value.rule in RULES


@pytest.mark.parametrize(("url", "note"), ALLOWED, ids=[u for u, _ in ALLOWED])
async def test_allowed_row_dials_exactly_the_vetted_address(url, note):
    outbound, resolver, connector = door()
    tool = WebFetch(outbound=outbound)
    result = await tool.run(tool.parse({"url": url}), CTX)
    assert result.success, result.error
    assert result.output["status"] == 200
    assert result.output["text"] == "canned"
    assert connector.attempts == [expected_dial(url)]
    host = httpx.URL(url).host
    assert resolver.questions == ([(host, expected_dial(url)[1])] if host in DNS else [])
    stream = connector.streams[0]
    assert f"Host: {httpx.URL(url).netloc.decode()}".encode() in stream.written
    if url.startswith("https:"):
        assert stream.server_hostname == host


@pytest.mark.parametrize(("url", "note"), ALLOWED, ids=[u for u, _ in ALLOWED])
async def test_allowed_row_through_the_raw_client(url, note):
    outbound, _, connector = door()
    async with outbound.client(allow=AllowList()) as client:
        response = await client.get(url)
    assert response.status_code == 200
    assert connector.attempts == [expected_dial(url)]
