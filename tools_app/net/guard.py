"""The SSRF guard: strict URL and host parsing, the deny list of networks, the allow list, and resolve-once vetting."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
import unicodedata
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import httpx
import idna

logger = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[str]]]

SCHEMES = {"http": 80, "https": 443}
MAX_REDIRECTS = 5
MAX_URL_LENGTH = 8192

RULES = {
    "scheme": "only http and https URLs may be fetched",
    "userinfo": "URLs carrying a user name or password are refused",
    "port": "the port must be 1-65535",
    "malformed_url": "the URL is malformed",
    "malformed_host": "the host is malformed",
    "bad_idna": "the host is not a valid internationalised domain name",
    "confusable_host": "the host imitates other characters (full-width forms, look-alike dots, mixed scripts)",
    "local_name": "the name is reserved for local or internal networks",
    "bad_answer": "the resolver returned something that is not an IP address",
    "unix_socket": "unix sockets are never dialed",
    "unpinned": "a connection was attempted to an address that was not vetted for this request",
    "unspecified": "an unspecified address",
    "this_network": "an address of 'this network' (0.0.0.0/8)",
    "loopback": "a loopback address",
    "private": "a private address (RFC 1918)",
    "cgnat": "a carrier-grade NAT address (100.64.0.0/10)",
    "link_local": "a link-local address",
    "metadata": "a cloud metadata service address",
    "ietf_protocol": "an IETF protocol assignment (192.0.0.0/24)",
    "documentation": "a documentation address",
    "benchmark": "a benchmarking address",
    "multicast": "a multicast address",
    "broadcast": "the broadcast address",
    "reserved": "a reserved or unallocated address",
    "6to4_relay": "the 6to4 relay anycast range",
    "ipv4_mapped": "an IPv4-mapped IPv6 address (::ffff:0:0/96)",
    "ipv4_translated": "an IPv4-translated IPv6 address (::ffff:0:0:0/96)",
    "ipv4_compatible": "an IPv4-compatible IPv6 address (::/96)",
    "nat64": "a NAT64 address that embeds an IPv4 address",
    "6to4": "a 6to4 address that embeds an IPv4 address (2002::/16)",
    "teredo": "a Teredo address that embeds an IPv4 address (2001::/32)",
    "discard": "the IPv6 discard-only range (100::/64)",
    "orchid": "an ORCHID identifier, not routable",
    "srv6": "an SRv6 segment identifier (5f00::/16)",
    "unique_local": "an IPv6 unique-local address (fc00::/7)",
    "site_local": "an IPv6 site-local address (fec0::/10)",
}

# Order matters: the first match names the rule, so single metadata addresses precede the ranges holding them.
_DENY_V4 = tuple(
    (ipaddress.IPv4Network(net), rule)
    for net, rule in (
        ("169.254.169.254/32", "metadata"),
        ("169.254.170.2/32", "metadata"),
        ("100.100.100.200/32", "metadata"),
        ("168.63.129.16/32", "metadata"),
        ("192.0.0.192/32", "metadata"),
        ("0.0.0.0/32", "unspecified"),
        ("0.0.0.0/8", "this_network"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "cgnat"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link_local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "ietf_protocol"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4_relay"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmark"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("255.255.255.255/32", "broadcast"),
        ("240.0.0.0/4", "reserved"),
    )
)
_DENY_V6 = tuple(
    (ipaddress.IPv6Network(net), rule)
    for net, rule in (
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("fd00:ec2::254/128", "metadata"),
        ("::ffff:0:0/96", "ipv4_mapped"),
        ("::ffff:0:0:0/96", "ipv4_translated"),
        ("::/96", "ipv4_compatible"),
        ("64:ff9b::/96", "nat64"),
        ("64:ff9b:1::/48", "nat64"),
        ("100::/64", "discard"),
        ("2001::/32", "teredo"),
        ("2001:2::/48", "benchmark"),
        ("2001:10::/28", "orchid"),
        ("2001:20::/28", "orchid"),
        ("2001:db8::/32", "documentation"),
        ("2002::/16", "6to4"),
        ("3fff::/20", "documentation"),
        ("5f00::/16", "srv6"),
        ("fc00::/7", "unique_local"),
        ("fe80::/10", "link_local"),
        ("fec0::/10", "site_local"),
        ("ff00::/8", "multicast"),
    )
)
# Everything public in IPv6 lives in 2000::/3; anything else is refused even if no named range covers it.
_GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")

LOCAL_NAMES = ("localhost", "localhost.localdomain")
LOCAL_SUFFIXES = (".localhost", ".local", ".internal", ".localdomain", ".home.arpa", ".arpa")
_UNICODE_DOTS = frozenset("\u3002\uff0e\uff61")
_LOOKALIKE_SCRIPTS = frozenset({"LATIN", "CYRILLIC", "GREEK"})
_ASCII_HOST = re.compile(r"^[a-z0-9.-]+$")
_LDH_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_NUMERIC_LABEL = re.compile(r"^(?:[0-9]+|0x[0-9a-f]*)$")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


class SsrfBlocked(httpx.RequestError):
    """A request the guard refused before any connection was made; `rule` names what fired."""

    def __init__(self, rule: str, url: str, *, host: str | None = None, address: str | None = None, why: str = ""):
        self.rule = rule
        self.url = url
        self.host = host
        self.address = address
        reason = why or RULES[rule]
        subject = f"{host} resolves to {address}: " if host and address and host != address else ""
        super().__init__(f"refused {url}: {subject}{reason} (rule {rule})")

    def detail(self) -> dict[str, str]:
        detail = {"rule": self.rule, "url": self.url}
        if self.host:
            detail["host"] = self.host
        if self.address:
            detail["address"] = self.address
        return detail


def _ranges(table: tuple[tuple[IPNetwork, str], ...]) -> tuple[tuple[int, int, str], ...]:
    return tuple((int(net.network_address), int(net.broadcast_address), rule) for net, rule in table)


# The same tables as integer ranges: comparing ints is ten times cheaper than `address in network`.
_RANGES = {4: _ranges(_DENY_V4), 6: _ranges(_DENY_V6)}


def address_rule(address: IPAddress) -> str | None:
    """The deny rule an address falls under, or None for a public address."""
    value = int(address)
    for low, high, rule in _RANGES[address.version]:
        if low <= value <= high:
            return rule
    if address.version == 6 and address not in _GLOBAL_UNICAST_V6:
        return "reserved"
    return None


@dataclass(frozen=True)
class Host:
    """A host as it is judged and dialed: lower-case ASCII, no trailing dot; `address` is set for IP literals."""

    name: str
    address: IPAddress | None = None

    @property
    def url_form(self) -> str:
        return f"[{self.name}]" if self.address is not None and self.address.version == 6 else self.name


@dataclass(frozen=True)
class Target:
    """A URL that passed the static checks: normalised, with the host and port that will be dialed."""

    url: str
    scheme: str
    host: Host
    port: int


def _ipv4_parse(labels: list[str], url: str, text: str) -> ipaddress.IPv4Address:
    """inet_aton forms as browsers read them: 1 to 4 parts, each decimal, 0x-hex or 0-octal."""
    if len(labels) > 4:
        raise SsrfBlocked("malformed_host", url, host=text, why="a numeric host has more than four parts")
    numbers = []
    for part in labels:
        try:
            if part.startswith("0x"):
                numbers.append(int(part[2:], 16) if part[2:] else 0)
            elif len(part) > 1 and part.startswith("0"):
                numbers.append(int(part, 8))
            else:
                numbers.append(int(part, 10))
        except ValueError:
            raise SsrfBlocked("malformed_host", url, host=text, why=f"{part!r} is not a number") from None
    if any(n > 255 for n in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(numbers)):
        raise SsrfBlocked("malformed_host", url, host=text, why="a part of the IPv4 address is out of range")
    value = numbers[-1] + sum(n << (8 * (3 - i)) for i, n in enumerate(numbers[:-1]))
    return ipaddress.IPv4Address(value)


def _scripts(label: str) -> set[str]:
    scripts = set()
    for char in label:
        if char.isalpha():
            scripts.add("LATIN" if char.isascii() else unicodedata.name(char, "UNKNOWN").split(" ", 1)[0])
    return scripts


def _check_scripts(unicode_host: str, url: str) -> None:
    for label in unicode_host.split("."):
        if len(_scripts(label) & _LOOKALIKE_SCRIPTS) > 1:
            why = f"label {label!r} mixes look-alike scripts"
            raise SsrfBlocked("confusable_host", url, host=unicode_host, why=why)


def host_parse(text: str, *, url: str) -> Host:
    """Parse a URL's host strictly: a bracketed IPv6 literal, a (legacy-form) IPv4 address or an LDH/IDNA name."""
    if text.startswith("["):
        inner = text[1:-1] if text.endswith("]") else ""
        if not inner or "%" in inner:
            raise SsrfBlocked("malformed_host", url, host=text, why="not a valid IPv6 literal (zone ids are refused)")
        try:
            address = ipaddress.IPv6Address(inner)
        except ValueError:
            raise SsrfBlocked("malformed_host", url, host=text, why="not a valid IPv6 literal") from None
        return Host(str(address), address)
    if not text.isascii():
        if any(char in _UNICODE_DOTS for char in text) or unicodedata.normalize("NFKC", text) != text:
            raise SsrfBlocked("confusable_host", url, host=text)
        _check_scripts(text.lower(), url)
        try:
            text = idna.encode(text.lower(), uts46=False).decode("ascii")
        except (idna.IDNAError, UnicodeError, ValueError):
            raise SsrfBlocked("bad_idna", url, host=text) from None
    name = text.lower()
    if not _ASCII_HOST.match(name):
        raise SsrfBlocked("malformed_host", url, host=text, why="the host may hold only letters, digits, '-' and '.'")
    if name.endswith("."):
        name = name[:-1]
    labels = name.split(".")
    if not name or len(name) > 253 or "" in labels:
        raise SsrfBlocked("malformed_host", url, host=text, why="the host has an empty or over-long label")
    if _NUMERIC_LABEL.match(labels[-1]):
        address = _ipv4_parse(labels, url, text)
        return Host(str(address), address)
    for label in labels:
        if label.startswith("xn--"):
            try:
                _check_scripts(idna.decode(label), url)
            except (idna.IDNAError, UnicodeError, ValueError):
                raise SsrfBlocked("bad_idna", url, host=text, why=f"{label!r} is not a valid IDNA label") from None
        if not _LDH_LABEL.match(label):
            raise SsrfBlocked("malformed_host", url, host=text, why=f"label {label!r} is not a valid host label")
    return Host(name)


def _authority_parse(authority: str, url: str) -> tuple[Host, int | None]:
    if "@" in authority:
        raise SsrfBlocked("userinfo", url)
    if authority.startswith("["):
        end = authority.find("]")
        host_text, rest = (authority[: end + 1], authority[end + 1 :]) if end != -1 else (authority, "")
    else:
        host_text, colon, port_text = authority.partition(":")
        rest = colon + port_text
    if rest and not rest.startswith(":"):
        raise SsrfBlocked("malformed_url", url, why="unexpected text after the host")
    port_text = rest[1:]
    port = None
    if port_text:
        if not port_text.isascii() or not port_text.isdigit():
            raise SsrfBlocked("port", url, why=f"port {port_text!r} is not a number")
        port = int(port_text)
        if not 1 <= port <= 65535:
            raise SsrfBlocked("port", url)
    return host_parse(host_text, url=url), port


def url_parse(raw: str) -> Target:
    """Parse a URL strictly; control characters, spaces and backslashes (read differently by different parsers) fail."""
    if len(raw) > MAX_URL_LENGTH:
        raise SsrfBlocked("malformed_url", raw[:100] + "...", why=f"the URL is longer than {MAX_URL_LENGTH} characters")
    if any(ord(char) <= 0x20 or 0x7F <= ord(char) <= 0x9F for char in raw) or "\\" in raw:
        raise SsrfBlocked("malformed_url", raw, why="the URL holds spaces, control characters or backslashes")
    match = _SCHEME.match(raw)
    if match is None:
        raise SsrfBlocked("malformed_url", raw, why="the URL has no scheme")
    scheme = match.group(1).lower()
    if scheme not in SCHEMES:
        raise SsrfBlocked("scheme", raw, why=f"scheme {scheme!r} is refused; only http and https may be fetched")
    rest = raw[match.end() :]
    if not rest.startswith("//"):
        raise SsrfBlocked("malformed_url", raw, why="the URL has no //host part")
    rest = rest[2:].split("#", 1)[0]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i != -1), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    host, port = _authority_parse(authority, raw)
    port = port or SCHEMES[scheme]
    shown_port = "" if port == SCHEMES[scheme] else f":{port}"
    if not path.startswith("/"):
        path = "/" + path
    return Target(f"{scheme}://{host.url_form}{shown_port}{path}", scheme, host, port)


def target_from_url(url: httpx.URL) -> Target:
    """The same checks for a URL httpx already parsed (a redirect hop): judge the host httpx will dial."""
    text = str(url)
    scheme = url.scheme
    if not scheme or not url.raw_host:
        raise SsrfBlocked("malformed_url", text, why="the URL has no scheme or no host")
    if scheme not in SCHEMES:
        raise SsrfBlocked("scheme", text, why=f"scheme {scheme!r} is refused; only http and https may be fetched")
    if url.userinfo:
        raise SsrfBlocked("userinfo", text)
    raw_host = url.raw_host.decode("ascii")
    host = host_parse(f"[{raw_host}]" if ":" in raw_host else raw_host, url=text)
    port = SCHEMES[scheme] if url.port is None else url.port
    if not 1 <= port <= 65535:
        raise SsrfBlocked("port", text)
    return Target(text, scheme, host, port)


@dataclass(frozen=True)
class AllowEntry:
    """One allow-list line: an exact host (optionally with a port) or a network."""

    text: str
    host: str | None = None
    port: int | None = None
    network: IPNetwork | None = None

    @property
    def kind(self) -> str:
        return "network" if self.network is not None else "host"


def allow_entry_parse(text: str) -> AllowEntry:
    """`name`, `name:port`, `10.0.0.5`, `[fd00::1]:8443` or a network such as `10.0.0.0/8`; ValueError otherwise."""
    text = text.strip()
    if "/" in text:
        try:
            return AllowEntry(text, network=ipaddress.ip_network(text, strict=True))
        except ValueError as exc:
            raise ValueError(f"{text!r} is not a network such as 10.0.0.0/8 or fd00::/8: {exc}") from None
    if not text or any(char in text for char in "@?#"):
        raise ValueError(f"{text!r} is not a host, host:port or network")
    try:
        host, port = _authority_parse(text, text)
    except SsrfBlocked as exc:
        raise ValueError(f"{text!r} is not a host, host:port or network: {RULES[exc.rule]}") from None
    return AllowEntry(text, host=host.name, port=port)


@dataclass(frozen=True)
class AllowList:
    """The only way to reach a non-public address: exact hosts (with an optional port) and networks."""

    entries: tuple[AllowEntry, ...] = ()
    _hosts: frozenset[tuple[str, int | None]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        hosts = frozenset((e.host, e.port) for e in self.entries if e.host is not None)
        object.__setattr__(self, "_hosts", hosts)

    @classmethod
    def parse(cls, texts: Iterable[str], *, skip_invalid: bool = False) -> AllowList:
        entries = []
        for text in texts:
            try:
                entries.append(allow_entry_parse(text))
            except ValueError:
                if not skip_invalid:
                    raise
                logger.warning("ignoring invalid network allow entry %r", text)
        return cls(tuple(entries))

    def allows_host(self, host: Host, port: int) -> bool:
        return (host.name, None) in self._hosts or (host.name, port) in self._hosts

    def allows_address(self, address: IPAddress, rule: str) -> bool:
        """A network entry opens the addresses it holds; a metadata address only to an entry naming it alone."""
        for entry in self.entries:
            network = entry.network
            if network is None or address not in network:
                continue
            if rule != "metadata" or network.num_addresses == 1:
                return True
        return False


async def system_resolve(host: str, port: int) -> list[str]:
    """The operating system's resolver, asked once per request hop."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise httpx.ConnectError(f"could not resolve {host}: {exc.strerror}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _answer_parse(answer: str, target: Target) -> IPAddress:
    try:
        return ipaddress.ip_address(answer.split("%", 1)[0])
    except ValueError:
        raise SsrfBlocked("bad_answer", target.url, host=target.host.name, address=str(answer)[:100]) from None


class Guard:
    """Judges URLs against the deny list and the allow list, and resolves names exactly once per hop."""

    def __init__(self, *, allow: AllowList | None = None, resolver: Resolver = system_resolve):
        self.allow = allow or AllowList()
        self.resolver = resolver

    def check(self, raw: str) -> Target:
        """Static checks of a URL given as text: everything that can be refused without resolving."""
        target = url_parse(raw)
        self._judge_static(target)
        return target

    def check_url(self, url: httpx.URL) -> Target:
        target = target_from_url(url)
        self._judge_static(target)
        return target

    def _judge_static(self, target: Target) -> None:
        host = target.host
        if self.allow.allows_host(host, target.port):
            return
        if host.address is not None:
            self._judge_address(target, host.address)
        elif host.name in LOCAL_NAMES or host.name.endswith(LOCAL_SUFFIXES):
            raise SsrfBlocked("local_name", target.url, host=host.name)

    def _judge_address(self, target: Target, address: IPAddress) -> None:
        rule = address_rule(address)
        if rule is not None and not self.allow.allows_address(address, rule):
            raise SsrfBlocked(rule, target.url, host=target.host.name, address=str(address))

    async def resolve(self, target: Target) -> tuple[str, ...]:
        """The addresses to dial: every answer vetted; one non-public answer refuses the whole request."""
        host = target.host
        if host.address is not None:
            return (host.name,)
        answers = await self.resolver(host.name, target.port)
        if not answers:
            raise httpx.ConnectError(f"{host.name} has no addresses")
        addresses = [_answer_parse(answer, target) for answer in answers]
        if not self.allow.allows_host(host, target.port):
            for address in addresses:
                self._judge_address(target, address)
        return tuple(dict.fromkeys(str(address) for address in addresses))

    async def vet(self, raw: str) -> tuple[Target, tuple[str, ...]]:
        """Check and resolve a URL given as text: what a caller dialing by other means (a browser) must use."""
        target = self.check(raw)
        return target, await self.resolve(target)
