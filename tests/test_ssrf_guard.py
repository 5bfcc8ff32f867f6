"""The guard's rules one by one: parsing, the deny list, the allow list and resolve-once vetting."""

import ipaddress

import httpx
import pytest

from tools_app.net.guard import (
    AllowList,
    Guard,
    SsrfBlocked,
    address_rule,
    allow_entry_parse,
    host_parse,
    url_parse,
)
from tools_app.net.testing import ScriptedResolver


def refused(raw: str, *, allow: AllowList | None = None) -> str:
    with pytest.raises(SsrfBlocked) as caught:
        Guard(allow=allow).check(raw)
    return caught.value.rule


@pytest.mark.parametrize(
    ("raw", "rule"),
    [
        ("http://127.0.0.%31/", "malformed_host"),  # browsers percent-decode hosts; we refuse them
        ("http://evil.com\\@127.0.0.1/", "malformed_url"),  # backslash: WHATWG and httpx read it differently
        ("http://12\n7.0.0.1/", "malformed_url"),  # urllib silently drops the newline
        ("http://127.0.0.1\t/", "malformed_url"),
        ("http:// 127.0.0.1/", "malformed_url"),
        ("http:/127.0.0.1/", "malformed_url"),
        ("http:127.0.0.1", "malformed_url"),
        ("127.0.0.1", "malformed_url"),
        ("javascript:alert(1)", "scheme"),
        ("HTTPS://[::1]:443/", "loopback"),
        ("http://[fe80::1%25eth0]/", "malformed_host"),  # zone ids
        ("http://[127.0.0.1]/", "malformed_host"),
        ("http://[::1/", "malformed_host"),
        ("http://1.2.3.4.5/", "malformed_host"),
        ("http://256.1.1.1/", "malformed_host"),
        ("http://1.2.3.0x100/", "malformed_host"),
        ("http://4294967296/", "malformed_host"),
        ("http://08.1.1.1/", "malformed_host"),  # 0-prefixed is octal: 8 is no octal digit
        ("http://foo.123/", "malformed_host"),  # ends in a number, so it must be an address
        ("http://0x/", "unspecified"),
        ("http://0xa9fea9fe/", "metadata"),
        ("http://0251.0376.0251.0376/", "metadata"),
        ("http://169.254.43518/", "metadata"),
        ("http://a_b.example/", "malformed_host"),
        ("http://-a.example/", "malformed_host"),
        ("http://a..example/", "malformed_host"),
        ("http://" + "a" * 64 + ".example/", "malformed_host"),
        ("http://ｌｏｃａｌｈｏｓｔ/", "confusable_host"),  # full-width letters
        ("http://127．0．0．1/", "confusable_host"),
        ("http://127｡0｡0｡1/", "confusable_host"),
        ("http://pаypal.com/", "confusable_host"),  # Cyrillic а among Latin letters
        ("http://xn--pypal-4ve.com/", "confusable_host"),  # the same, already in punycode
        ("http://exa\u200dmple.com/", "bad_idna"),  # an invisible zero-width joiner
        ("http://BÜCHER.example\u0301/", "confusable_host"),
        ("http://xn--/", "bad_idna"),
        ("http://xn--a.example/", "bad_idna"),
        ("http://example.com:0/", "port"),
        ("http://example.com:99999/", "port"),
        ("http://example.com:8o/", "port"),
        ("http://example.com:８０/", "port"),
        ("http://example.com:80:80/", "port"),
        ("http://:80/", "malformed_host"),
        ("http:///path", "malformed_host"),
        ("http://user@example.com/", "userinfo"),
        ("http://@example.com/", "userinfo"),
        ("http://a.localhost/", "local_name"),
        ("http://printer.local/", "local_name"),
        ("http://db.internal/", "local_name"),
        ("http://router.home.arpa/", "local_name"),
        ("http://1.0.0.127.in-addr.arpa/", "local_name"),
    ],
)
def test_refusals_name_their_rule(raw, rule):
    assert refused(raw) == rule


def test_a_refusal_never_crashes_on_odd_unicode():
    for raw in ("http://\udcff/", "http://\u0000/", "http://☃.net/", "http://ß.de/", "http://.../", "http://[]/"):
        try:
            Guard().check(raw)
        except SsrfBlocked:
            pass


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("HTTP://Example.COM", "http://example.com/"),
        ("http://example.com.:80/a?b=c#frag", "http://example.com/a?b=c"),
        ("https://example.com:443", "https://example.com/"),
        ("http://example.com:8080?q", "http://example.com:8080/?q"),
        ("http://1.2.3/", "http://1.2.0.3/"),
        ("http://134744072/", "http://8.8.8.8/"),
        ("http://bücher.example/", "http://xn--bcher-kva.example/"),
        ("http://[2606:4700:4700:0:0:0:0:1111]/", "http://[2606:4700:4700::1111]/"),
        ("https://日本語.jp/", "https://xn--wgv71a119e.jp/"),
        ("http://r3---sn-abc.googlevideo.com/", "http://r3---sn-abc.googlevideo.com/"),
    ],
)
def test_public_urls_are_normalised(raw, normal):
    assert Guard().check(raw).url == normal


@pytest.mark.parametrize(
    ("address", "rule"),
    [
        ("0.1.2.3", "this_network"),
        ("192.0.0.8", "ietf_protocol"),
        ("192.0.2.1", "documentation"),
        ("198.51.100.7", "documentation"),
        ("203.0.113.9", "documentation"),
        ("192.88.99.1", "6to4_relay"),
        ("240.0.0.1", "reserved"),
        ("169.254.170.2", "metadata"),
        ("168.63.129.16", "metadata"),
        ("169.254.1.1", "link_local"),
        ("::ffff:8.8.8.8", "ipv4_mapped"),  # even a public IPv4 inside: the embedded forms are refused whole
        ("::ffff:0:808:808", "ipv4_translated"),
        ("::8.8.8.8", "ipv4_compatible"),
        ("64:ff9b::808:808", "nat64"),
        ("64:ff9b:1::a00:1", "nat64"),
        ("2002:a9fe:a9fe::", "6to4"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "teredo"),
        ("2001:db8::1", "documentation"),
        ("3fff::1", "documentation"),
        ("2001:2::1", "benchmark"),
        ("2001:10::1", "orchid"),
        ("100::1", "discard"),
        ("fec0::1", "site_local"),
        ("fd12:3456::1", "unique_local"),
        ("ff05::2", "multicast"),
        ("4000::1", "reserved"),  # outside 2000::/3: unallocated
        ("::2", "ipv4_compatible"),
        ("5f00::1", "srv6"),
    ],
)
def test_deny_list(address, rule):
    assert address_rule(ipaddress.ip_address(address)) == rule


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", "93.184.216.34", "100.63.255.255", "100.128.0.0", "2606:4700:4700::1111"]
)
def test_public_addresses_pass(address):
    assert address_rule(ipaddress.ip_address(address)) is None


def test_allow_entries_parse_and_refuse_nonsense():
    assert allow_entry_parse("MCP.internal").host == "mcp.internal"
    assert allow_entry_parse("127.0.0.1:8931").port == 8931
    assert allow_entry_parse("[::1]:8443").host == "::1"
    assert allow_entry_parse("10.0.0.0/8").network == ipaddress.ip_network("10.0.0.0/8")
    assert allow_entry_parse("127.1").host == "127.0.0.1"
    for bad in ("10.0.0.1/8", "http://x/", "a@b", "host:0", "", "exa mple", "fd00::/200", "x:y"):
        with pytest.raises(ValueError):
            allow_entry_parse(bad)


def test_an_allowed_host_is_exact_and_port_bound():
    allow = AllowList.parse(["127.0.0.1:8931", "mcp.internal"])
    guard = Guard(allow=allow)
    assert guard.check("http://127.0.0.1:8931/mcp").host.name == "127.0.0.1"
    assert refused("http://127.0.0.1:8932/", allow=allow) == "loopback"
    assert refused("http://localhost:8931/", allow=allow) == "local_name"  # the name is not the address
    assert refused("http://127.0.0.2:8931/", allow=allow) == "loopback"
    assert guard.check("http://mcp.internal:9999/").host.name == "mcp.internal"
    assert refused("http://user@127.0.0.1:8931/", allow=allow) == "userinfo"  # never bypassable


async def test_an_allowed_host_may_resolve_to_private_addresses():
    guard = Guard(allow=AllowList.parse(["mcp.internal"]), resolver=ScriptedResolver({"mcp.internal": ["10.1.2.3"]}))
    target, addresses = await guard.vet("http://mcp.internal/")
    assert addresses == ("10.1.2.3",)


async def test_an_allowed_network_opens_its_addresses_for_any_name():
    resolver = ScriptedResolver({"a.example": ["10.1.2.3"], "b.example": ["10.9.9.9"]})
    guard = Guard(allow=AllowList.parse(["10.1.0.0/16"]), resolver=resolver)
    assert (await guard.vet("http://a.example/"))[1] == ("10.1.2.3",)
    assert guard.check("http://10.1.200.1:5000/").host.name == "10.1.200.1"
    with pytest.raises(SsrfBlocked) as caught:
        await guard.vet("http://b.example/")
    assert caught.value.rule == "private" and caught.value.address == "10.9.9.9"


def test_metadata_needs_an_entry_naming_it_alone():
    assert refused("http://169.254.169.254/", allow=AllowList.parse(["169.254.0.0/16"])) == "metadata"
    assert Guard(allow=AllowList.parse(["169.254.0.0/16"])).check("http://169.254.1.1/")
    assert Guard(allow=AllowList.parse(["169.254.169.254/32"])).check("http://169.254.169.254/")


async def test_any_bad_answer_refuses_and_garbage_answers_fail_closed():
    resolver = ScriptedResolver(
        {
            "mixed.example": ["93.184.216.34", "2606:4700::1", "fd00::1"],
            "garbage.example": ["93.184.216.34", "not-an-ip"],
            "empty.example": [],
            "scoped.example": ["fe80::1%eth0"],
        }
    )
    guard = Guard(resolver=resolver)
    for name, rule in (("mixed.example", "unique_local"), ("garbage.example", "bad_answer")):
        with pytest.raises(SsrfBlocked) as caught:
            await guard.vet(f"http://{name}/")
        assert caught.value.rule == rule
    with pytest.raises(SsrfBlocked) as caught:
        await guard.vet("http://scoped.example/")
    assert caught.value.rule == "link_local"
    with pytest.raises(httpx.ConnectError):
        await guard.vet("http://empty.example/")
    with pytest.raises(httpx.ConnectError):
        await guard.vet("http://unknown.example/")


async def test_names_are_resolved_once_and_literals_never():
    resolver = ScriptedResolver({"public.example": ["93.184.216.34", "2606:2800:220:1::1", "93.184.216.34"]})
    guard = Guard(resolver=resolver)
    target, addresses = await guard.vet("http://public.example:8080/x")
    assert addresses == ("93.184.216.34", "2606:2800:220:1::1")
    assert resolver.questions == [("public.example", 8080)]
    await guard.vet("http://8.8.8.8/")
    assert resolver.questions == [("public.example", 8080)]


def test_the_message_says_which_rule_fired_and_why():
    with pytest.raises(SsrfBlocked) as caught:
        url_parse("gopher://127.0.0.1:6379/_INFO")
    assert "gopher" in str(caught.value) and "(rule scheme)" in str(caught.value)
    assert caught.value.detail() == {"rule": "scheme", "url": "gopher://127.0.0.1:6379/_INFO"}
    assert isinstance(caught.value, httpx.RequestError)


def test_host_parse_keeps_ipv6_brackets_out_of_the_name():
    host = host_parse("[::1]", url="x")
    assert (host.name, host.url_form) == ("::1", "[::1]")
