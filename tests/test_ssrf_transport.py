"""The pinned transport against real local servers: redirect hops, rebinding, TLS by name to 127.0.0.1, no proxies."""

import datetime
import ssl

import httpcore
import httpx
import httpx2
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tools_app.builtin.web import WebFetch
from tools_app.chokepoint.base import ToolContext
from tools_app.net import AllowList, Guard, Outbound, SsrfBlocked
from tools_app.net.testing import RecordingConnector, ScriptedResolver, StubServer, respond
from tools_app.net.transport import GuardedHttpx2Transport, GuardedTransport, PinnedBackend

CTX = ToolContext(call_id="c", agent_id=1, agent_name="builder", channel_name="ops", session_key=None, attended=True)


def redirect_to(location: str, status: int = 302):
    return lambda handler: respond(handler, status, location=location)


def ok(body: bytes = b"arrived", content_type: str = "text/plain"):
    return lambda handler: respond(handler, 200, body, content_type=content_type)


BAD_REDIRECTS = {
    "/to-metadata": ("http://169.254.169.254/latest/meta-data/", 302, "metadata"),
    "/to-localhost": ("http://localhost/", 307, "local_name"),
    "/to-scheme-relative": ("//169.254.169.254/x", 302, "metadata"),
    "/to-file": ("file:///etc/passwd", 302, "scheme"),
    "/to-gopher": ("gopher://127.0.0.1:6379/_INFO", 301, "scheme"),
    "/to-decimal-loopback": ("http://2130706433/", 302, "loopback"),
    "/to-private-name": ("http://internal.test/", 303, "private"),
    "/to-userinfo": ("http://evil.test@127.0.0.1/", 302, "userinfo"),
    "/to-mapped": ("http://[::ffff:127.0.0.1]/", 308, "ipv4_mapped"),
    "/to-bad-idna": ("http://xn--localhost-/", 302, "bad_idna"),
}


@pytest.fixture
def stub():
    routes = {"/ok": ok(), "/loop": redirect_to("/loop"), "/start": redirect_to("/hop1"), "/hop1": redirect_to("/ok")}
    for n in range(1, 7):
        routes[f"/chain/{n}"] = redirect_to(f"/chain/{n - 1}" if n > 1 else "/ok")
    for path, (location, status, _) in BAD_REDIRECTS.items():
        routes[path] = redirect_to(location, status)
    with StubServer(routes) as server:
        routes["/to-same-port-by-name"] = redirect_to(f"http://localhost:{server.port}/ok")
        routes["/to-stub-by-other-name"] = redirect_to(f"http://other.test:{server.port}/ok")
        yield server


def door(stub, *, allow=None, table=None):
    """The stub's own address:port is the only exception; `stub.test` and `other.test` resolve to it too."""
    resolver = ScriptedResolver({"stub.test": ["127.0.0.1"], "other.test": ["127.0.0.1"], **(table or {})})
    resolver.table.setdefault("internal.test", ["10.0.0.7"])
    connector = RecordingConnector()
    allow_list = AllowList.parse(allow or [f"127.0.0.1:{stub.port}"])
    return Outbound(allow_source=lambda: allow_list, resolver=resolver, connector=connector), resolver, connector


async def fetch(outbound, url, **args):
    tool = WebFetch(outbound=outbound)
    return await tool.run(tool.parse({"url": url, **args}), CTX)


async def test_a_redirect_chain_is_checked_at_every_hop(stub, monkeypatch):
    checked = []
    check_url = Guard.check_url

    def spy(self, url):
        checked.append(str(url))
        return check_url(self, url)

    monkeypatch.setattr(Guard, "check_url", spy)
    outbound, resolver, connector = door(stub, allow=[f"stub.test:{stub.port}"])
    result = await fetch(outbound, f"http://stub.test:{stub.port}/start")
    assert result.success, result.error
    assert [s.path for s in stub.seen] == ["/start", "/hop1", "/ok"]
    assert checked == [f"http://stub.test:{stub.port}{path}" for path in ("/start", "/hop1", "/ok")]
    assert resolver.questions == [("stub.test", stub.port)]  # the vetted answer serves the keep-alive window
    assert set(connector.attempts) == {("127.0.0.1", stub.port)}
    assert result.output["final_url"] == f"http://stub.test:{stub.port}/ok"
    assert [hop["status"] for hop in result.output["redirects"]] == [302, 302]
    assert all(s.host == f"stub.test:{stub.port}" for s in stub.seen)


@pytest.mark.parametrize("path", sorted(BAD_REDIRECTS))
async def test_a_bad_redirect_is_refused_before_connecting(stub, path):
    outbound, _, connector = door(stub)
    result = await fetch(outbound, stub.url(path))
    assert not result.success
    assert result.error.code == "ssrf_blocked", result.error
    assert result.error.detail["rule"] == BAD_REDIRECTS[path][2]
    assert set(connector.attempts) == {("127.0.0.1", stub.port)}
    assert [s.path for s in stub.seen] == [path]


@pytest.mark.parametrize("path", sorted(BAD_REDIRECTS))
async def test_a_bad_redirect_is_refused_by_the_raw_client_too(stub, path):
    outbound, _, connector = door(stub)
    async with await outbound.open() as client:
        with pytest.raises((SsrfBlocked, UnicodeError)):
            await client.get(stub.url(path))
    assert set(connector.attempts) == {("127.0.0.1", stub.port)}


async def test_the_exception_is_for_the_stub_address_only_not_names_that_reach_it(stub):
    outbound, _, connector = door(stub)
    for path, rule in (("/to-same-port-by-name", "local_name"), ("/to-stub-by-other-name", "loopback")):
        result = await fetch(outbound, stub.url(path))
        assert result.error.code == "ssrf_blocked"
        assert result.error.detail["rule"] == rule
    assert [s.path for s in stub.seen] == ["/to-same-port-by-name", "/to-stub-by-other-name"]


async def test_loops_stop_and_five_redirects_are_the_most(stub):
    outbound, _, _ = door(stub)
    looped = await fetch(outbound, stub.url("/loop"))
    assert looped.error.code == "too_many_redirects"
    assert len(stub.seen) == 6  # the first request and five redirects followed, the sixth refused
    five = await fetch(outbound, stub.url("/chain/5"))
    assert five.success and len(five.output["redirects"]) == 5
    six = await fetch(outbound, stub.url("/chain/6"))
    assert six.error.code == "too_many_redirects"
    with pytest.raises(ValueError):
        outbound.client(allow=AllowList(), max_redirects=6)


async def test_redirects_can_be_left_unfollowed(stub):
    outbound, _, _ = door(stub)
    result = await fetch(outbound, stub.url("/to-metadata"), follow_redirects=False)
    assert result.success
    assert result.output["status"] == 302
    assert result.output["headers"]["location"] == "http://169.254.169.254/latest/meta-data/"


async def test_rebinding_never_reaches_loopback():
    """Public at the first lookup, loopback at the second: the second request is refused, nothing dials 127.0.0.1."""
    resolver = ScriptedResolver({"rebind.test": [["93.184.216.34"], ["127.0.0.1"]]})
    connector = RecordingConnector()
    outbound = Outbound(resolver=resolver, connector=connector)
    first = await fetch(outbound, "http://rebind.test/")
    assert first.success and first.output["text"] == "canned"
    second = await fetch(outbound, "http://rebind.test/")
    assert second.error.code == "ssrf_blocked" and second.error.detail["address"] == "127.0.0.1"
    assert connector.attempts == [("93.184.216.34", 80)]
    assert resolver.questions == [("rebind.test", 80)] * 2


REDIRECT_AGAIN = b"HTTP/1.1 302 Found\r\nLocation: /again\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


async def test_rebinding_between_redirect_hops_never_reaches_loopback():
    """Within one client the vetted answer is reused, so the name is not asked again and loopback never comes up."""
    resolver = ScriptedResolver({"rebind.test": [["93.184.216.34"], ["127.0.0.1"]]})
    connector = RecordingConnector(canned=REDIRECT_AGAIN)
    async with Outbound(resolver=resolver, connector=connector).client(allow=AllowList()) as client:
        with pytest.raises(httpx.TooManyRedirects):
            await client.get("http://rebind.test/")
    assert connector.attempts == [("93.184.216.34", 80)] * 6
    assert resolver.questions == [("rebind.test", 80)]


async def test_rebinding_after_the_answer_expires_is_refused():
    resolver = ScriptedResolver({"rebind.test": [["93.184.216.34"], ["127.0.0.1"]]})
    connector = RecordingConnector(canned=REDIRECT_AGAIN)
    transport = GuardedTransport(
        guard=Guard(resolver=resolver),
        ssl_context=ssl.create_default_context(),
        connector=connector,
        limits=httpx.Limits(keepalive_expiry=0),
    )
    async with httpx.AsyncClient(transport=transport, follow_redirects=True) as client:
        with pytest.raises(SsrfBlocked) as caught:
            await client.get("http://rebind.test/")
    assert caught.value.rule == "loopback"
    assert connector.attempts == [("93.184.216.34", 80)]
    assert resolver.questions == [("rebind.test", 80)] * 2


async def test_the_real_backend_dials_the_vetted_address_not_the_name(stub):
    """`stub.test` exists only in the scripted resolver: the fetch works only if the socket opens to the address."""
    allow_list = AllowList.parse([f"stub.test:{stub.port}"])
    outbound = Outbound(allow_source=lambda: allow_list, resolver=ScriptedResolver({"stub.test": ["127.0.0.1"]}))
    result = await fetch(outbound, f"http://stub.test:{stub.port}/ok")
    assert result.success, result.error
    assert result.output["text"] == "arrived"
    assert stub.seen[-1].host == f"stub.test:{stub.port}"


async def test_ipv6_loopback_stub(stub):
    with StubServer({"/ok": ok(b"six")}, host="::1") as server:
        allow_list = AllowList.parse([f"[::1]:{server.port}"])
        result = await fetch(Outbound(allow_source=lambda: allow_list), server.url("/ok"))
    assert result.success, result.error
    assert result.output["text"] == "six"


async def test_environment_proxies_are_ignored(stub, monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    outbound, _, connector = door(stub)
    result = await fetch(outbound, stub.url("/ok"))
    assert result.success, result.error
    assert connector.attempts == [("127.0.0.1", stub.port)]
    for option in ("proxy", "mounts", "transport", "trust_env", "verify"):
        with pytest.raises(TypeError):
            outbound.client(allow=AllowList(), **{option: None})


async def test_unix_sockets_and_unpinned_dials_are_refused():
    backend = PinnedBackend(httpcore.AnyIOBackend())
    with pytest.raises(SsrfBlocked) as caught:
        await backend.connect_unix_socket("/var/run/docker.sock")
    assert caught.value.rule == "unix_socket"
    with pytest.raises(SsrfBlocked) as caught:
        await backend.connect_tcp("127.0.0.1", 6379)
    assert caught.value.rule == "unpinned"


# -- the httpx2 flavour (the MCP SDK's client) ------------------------------------------------------


@pytest.mark.parametrize("path", sorted(BAD_REDIRECTS))
async def test_the_httpx2_transport_refuses_each_bad_redirect_before_connecting(stub, path):
    outbound, _, connector = door(stub)
    transport = outbound.transport_httpx2(await outbound.allow_list())
    async with httpx2.AsyncClient(transport=transport, follow_redirects=True, trust_env=False) as client:
        with pytest.raises((httpx2.ConnectError, UnicodeError)) as caught:
            await client.get(stub.url(path))
    if caught.type is httpx2.ConnectError:
        assert f"(rule {BAD_REDIRECTS[path][2]})" in str(caught.value)
        assert isinstance(caught.value.__cause__, SsrfBlocked)
    assert set(connector.attempts) == {("127.0.0.1", stub.port)}
    assert [s.path for s in stub.seen] == [path]


async def test_the_httpx2_transport_dials_the_vetted_address_and_keeps_the_name(stub):
    allow_list = AllowList.parse([f"stub.test:{stub.port}"])
    outbound = Outbound(resolver=ScriptedResolver({"stub.test": ["127.0.0.1"]}))
    async with httpx2.AsyncClient(transport=outbound.transport_httpx2(allow_list), trust_env=False) as client:
        response = await client.get(f"http://stub.test:{stub.port}/ok")
    assert response.status_code == 200 and response.text == "arrived"
    assert stub.seen[-1].host == f"stub.test:{stub.port}"


async def test_the_httpx2_transport_never_follows_a_rebinding_name_to_loopback():
    resolver = ScriptedResolver({"rebind.test": [["93.184.216.34"], ["127.0.0.1"]]})
    connector = RecordingConnector()
    transport = GuardedHttpx2Transport(  # no keep-alive window: every request asks the resolver again
        guard=Guard(resolver=resolver),
        ssl_context=ssl.create_default_context(),
        connector=connector,
        limits=httpx.Limits(keepalive_expiry=0),
    )
    async with httpx2.AsyncClient(transport=transport, trust_env=False) as client:
        first = await client.get("http://rebind.test/")
        assert first.text == "canned"
        with pytest.raises(httpx2.ConnectError, match=r"\(rule loopback\)"):
            await client.get("http://rebind.test/")
    assert connector.attempts == [("93.184.216.34", 80)]


async def test_the_httpx2_transport_refuses_an_unresolvable_name_before_dialing():
    connector = RecordingConnector()
    transport = Outbound(resolver=ScriptedResolver({}), connector=connector).transport_httpx2(AllowList())
    async with httpx2.AsyncClient(transport=transport, trust_env=False) as client:
        with pytest.raises(httpx2.ConnectError, match="could not resolve nowhere.test"):
            await client.get("http://nowhere.test/")
    assert connector.attempts == []


# -- TLS ------------------------------------------------------------------------------------------


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_ca(tmp_path, label: str):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"Aleph test CA {label}"))
        .issuer_name(_name(f"Aleph test CA {label}"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    path = tmp_path / f"ca-{label}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert, path


def make_leaf(tmp_path, ca_key, ca_cert, name: str):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "leaf.pem", tmp_path / "leaf.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.fixture
def tls_stub(tmp_path):
    ca_key, ca_cert, ca_path = make_ca(tmp_path, "good")
    cert_path, key_path = make_leaf(tmp_path, ca_key, ca_cert, "secure.test")
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert_path, key_path)
    with StubServer({"/hello": ok(b"over tls")}, tls=server_context) as server:
        server.ca_path = ca_path
        server.other_ca_path = make_ca(tmp_path, "other")[2]
        yield server


def tls_door(server, ca_path, *names):
    table = {name: ["127.0.0.1"] for name in names}
    allow_list = AllowList.parse([f"{name}:{server.port}" for name in names])
    connector = RecordingConnector()
    outbound = Outbound(
        allow_source=lambda: allow_list,
        resolver=ScriptedResolver(table),
        connector=connector,
        verify=ssl.create_default_context(cafile=str(ca_path)),
    )
    return outbound, connector


async def test_tls_by_name_pinned_to_loopback_verifies_and_carries_the_name(tls_stub):
    outbound, connector = tls_door(tls_stub, tls_stub.ca_path, "secure.test")
    result = await fetch(outbound, f"https://secure.test:{tls_stub.port}/hello")
    assert result.success, result.error
    assert result.output["text"] == "over tls"
    assert connector.attempts == [("127.0.0.1", tls_stub.port)]
    seen = tls_stub.seen[-1]
    assert seen.sni == "secure.test"
    assert seen.host == f"secure.test:{tls_stub.port}"


async def test_tls_to_an_untrusted_certificate_fails(tls_stub):
    outbound, _ = tls_door(tls_stub, tls_stub.other_ca_path, "secure.test")
    result = await fetch(outbound, f"https://secure.test:{tls_stub.port}/hello")
    assert result.error.code == "fetch_failed"
    assert "CERTIFICATE_VERIFY_FAILED" in result.error.message
    assert tls_stub.seen == []


async def test_tls_with_a_name_the_certificate_does_not_carry_fails(tls_stub):
    outbound, connector = tls_door(tls_stub, tls_stub.ca_path, "other.test")
    result = await fetch(outbound, f"https://other.test:{tls_stub.port}/hello")
    assert result.error.code == "fetch_failed"
    assert "CERTIFICATE_VERIFY_FAILED" in result.error.message
    assert connector.attempts == [("127.0.0.1", tls_stub.port)]
    assert tls_stub.seen == []
