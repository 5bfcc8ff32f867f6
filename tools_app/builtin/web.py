"""web_fetch: GET or HEAD a public URL through the outbound door, size-capped, returned as readable content."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import zlib
from html.parser import HTMLParser
from typing import Any, Literal
from urllib.parse import urljoin

import httpx
from pydantic import Field

from ..chokepoint.base import READ_ONLY, ToolArgs, ToolContext, ToolResult, TypedTool
from ..net.client import Outbound
from ..net.guard import MAX_REDIRECTS, SsrfBlocked

USER_AGENT = "Aleph-web_fetch/1.0"
MAX_LINKS = 300
OMITTED_HEADERS = frozenset({"set-cookie"})
TEXT_TYPES = frozenset(
    {
        "application/javascript",
        "application/ecmascript",
        "application/xml",
        "application/x-www-form-urlencoded",
        "application/x-sh",
        "application/yaml",
        "application/toml",
        "image/svg+xml",
    }
)
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})


class FetchFailed(Exception):
    def __init__(self, code: str, message: str, **detail: Any):
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail


# Preformatted text travels between private-use markers so whitespace clean-up leaves it alone.
_PRE_START, _PRE_END = "\ue000", "\ue001"
_PRE = re.compile(f"({_PRE_START}[^{_PRE_END}]*{_PRE_END})")


class _Markdown(HTMLParser):
    """HTML to readable markdown: headings, paragraphs, lists, links and the title; scripts and styles dropped."""

    SKIP = frozenset({"script", "style", "noscript", "template", "svg", "iframe", "object", "canvas", "select"})
    BLOCK = frozenset(
        {"p", "div", "section", "article", "main", "header", "footer", "nav", "aside", "table", "tr", "ul", "ol"}
        | {"blockquote", "pre", "form", "figure", "figcaption", "dl", "dt", "dd", "hr", "address", "details"}
    )
    HEADINGS = {f"h{n}": "#" * n for n in range(1, 7)}

    def __init__(self, base_url: str):
        super().__init__(convert_charrefs=True)
        self.base_url = base_url
        self.parts: list[str] = []
        self.title = ""
        self.links: list[dict[str, str]] = []
        self._skip = 0
        self._in_title = False
        self._pre = 0
        self._link: tuple[str, int] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIP:
            self._skip += 1
        elif tag == "title":
            self._in_title = True
        elif tag == "base":
            self.base_url = urljoin(self.base_url, dict(attrs).get("href") or "")
        elif tag in self.HEADINGS:
            self.parts.append(f"\n\n{self.HEADINGS[tag]} ")
        elif tag == "li":
            self.parts.append("\n- ")
        elif tag == "br":
            self.parts.append("\n")
        elif tag in ("td", "th"):
            self.parts.append(" | ")
        elif tag == "pre":
            self._pre += 1
            self.parts.append("\n\n```\n")
        elif tag in self.BLOCK:
            self.parts.append("\n\n")
        elif tag == "a":
            self._link_close()
            href = (dict(attrs).get("href") or "").strip()
            url = urljoin(self.base_url, href) if href else ""
            if url.startswith(("http://", "https://")):
                self._link = (url, len(self.parts))

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self._skip = max(0, self._skip - 1)
        elif tag == "title":
            self._in_title = False
        elif tag == "pre":
            self._pre = max(0, self._pre - 1)
            self.parts.append("\n```\n\n")
        elif tag in self.HEADINGS or tag in self.BLOCK:
            self._link_close()  # a link left open by broken markup ends with its block
            self.parts.append("\n\n")
        elif tag == "a":
            self._link_close()

    def _link_close(self) -> None:
        if self._link is None:
            return
        url, start = self._link
        self._link = None
        text = " ".join(_PRE.sub(lambda m: m.group(0)[1:-1], "".join(self.parts[start:])).split())
        if text:
            self.parts[start:] = [f"[{text}]({url})"]
        if len(self.links) < MAX_LINKS:
            self.links.append({"text": text, "url": url})

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        if self._in_title:
            self.title += data
        elif self._pre:
            self.parts.append(f"{_PRE_START}{data}{_PRE_END}")
        else:
            self.parts.append(re.sub(r"\s+", " ", data))

    def markdown(self) -> str:
        self._link_close()
        pieces = []
        for piece in _PRE.split("".join(self.parts)):
            if piece.startswith(_PRE_START):
                pieces.append(piece[1:-1])
            else:
                piece = re.sub(r"[ \t]*\n[ \t]*", "\n", piece)
                pieces.append(re.sub(r"\n{3,}", "\n\n", piece))
        return "".join(pieces).strip()


def html_to_markdown(html: str, *, base_url: str) -> dict[str, Any]:
    parser = _Markdown(base_url)
    parser.feed(html)
    parser.close()
    return {"title": " ".join(parser.title.split()), "text": parser.markdown(), "links": parser.links}


class _Decoder:
    """Undo gzip/deflate chunk by chunk, never producing more than asked: a compression bomb stops at the cap."""

    def __init__(self, encoding: str):
        codings = [c.strip() for c in encoding.lower().split(",") if c.strip() and c.strip() != "identity"]
        if len(codings) > 1 or (codings and codings[0] not in ("gzip", "x-gzip", "deflate")):
            raise FetchFailed("unsupported_encoding", f"content encoding {encoding!r} is not supported")
        self._inflater = zlib.decompressobj(zlib.MAX_WBITS | 32) if codings else None

    def feed(self, chunk: bytes, limit: int) -> bytes:
        if self._inflater is None:
            return chunk[:limit]
        try:
            return self._inflater.decompress(chunk, limit)
        except zlib.error as exc:
            raise FetchFailed("decoding_error", f"the compressed body is corrupt: {exc}") from None


async def _read_capped(response: httpx.Response, cap: int) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise FetchFailed(
            "too_large", f"the response declares {declared} bytes, over the {cap}-byte cap", max_bytes=cap
        )
    decoder = _Decoder(response.headers.get("content-encoding", ""))
    body = bytearray()
    received = 0
    async for chunk in response.aiter_raw():
        received += len(chunk)
        body += decoder.feed(chunk, cap + 1 - len(body))
        if len(body) > cap or received > cap:
            raise FetchFailed(
                "too_large", f"the response is larger than the {cap}-byte cap; reading stopped", max_bytes=cap
            )
    return bytes(body)


def _headers(response: httpx.Response) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in response.headers.multi_items():
        if name in OMITTED_HEADERS:
            headers[name] = "(omitted)"
        else:
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def _text(body: bytes, response: httpx.Response) -> str:
    charset = response.charset_encoding or "utf-8"
    try:
        return body.decode(charset, errors="replace")
    except LookupError:
        return body.decode("utf-8", errors="replace")


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _content(body: bytes, response: httpx.Response, mime: str) -> dict[str, Any]:
    if mime in HTML_TYPES:
        return {"kind": "html", **html_to_markdown(_text(body, response), base_url=str(response.url))}
    if mime == "application/json" or mime.endswith("+json"):
        try:
            return {"kind": "json", "json": json.loads(_text(body, response), parse_constant=_reject_constant)}
        except ValueError:
            return {"kind": "text", "text": _text(body, response), "note": "declared JSON but does not parse"}
    if mime.startswith("text/") or mime in TEXT_TYPES or mime.endswith("+xml"):
        return {"kind": "text", "text": _text(body, response)}
    if not mime and b"\x00" not in body[:4096]:
        try:
            return {"kind": "text", "text": body.decode("utf-8")}
        except UnicodeDecodeError:
            pass
    return {
        "kind": "binary",
        "sha256": hashlib.sha256(body).hexdigest(),
        "note": f"binary content ({mime or 'unknown type'}, {len(body)} bytes) is summarised, not returned",
    }


class WebFetch(TypedTool):
    name = "web_fetch"
    description = (
        "Fetch a public http(s) URL with GET or HEAD. Returns the status, headers, final URL after redirects and the "
        "content: HTML as markdown with its title and links, JSON as JSON, text as text; binary is summarised. "
        "Private, loopback and cloud-metadata addresses are refused."
    )
    facts = READ_ONLY
    requires = ("outbound",)

    class Args(ToolArgs):
        url: str = Field(min_length=1, max_length=8192)
        """The http or https URL to fetch."""
        method: Literal["GET", "HEAD"] = "GET"
        """GET for the content, HEAD for status and headers only."""
        timeout_s: float = Field(default=20.0, gt=0, le=120)
        """The whole fetch, redirects and body included, must finish within this many seconds."""
        max_bytes: int = Field(default=2_000_000, ge=1, le=20_000_000)
        """The response body may be at most this many bytes (after decompression); reading stops past it."""
        follow_redirects: bool = True
        """Follow up to 5 redirects, each one checked again."""

    async def call(self, args: Args, ctx: ToolContext) -> ToolResult:
        outbound: Outbound = self.dependencies["outbound"]
        try:
            async with asyncio.timeout(args.timeout_s):
                return ToolResult.ok(await self._fetch(outbound, args))
        except SsrfBlocked as exc:
            return ToolResult.fail("ssrf_blocked", str(exc), **exc.detail())
        except FetchFailed as exc:
            return ToolResult.fail(exc.code, exc.message, url=args.url, **exc.detail)
        except (TimeoutError, httpx.TimeoutException):
            return ToolResult.fail(
                "timeout", f"{args.url} did not answer completely within {args.timeout_s:g} s", url=args.url
            )
        except httpx.TooManyRedirects:
            return ToolResult.fail(
                "too_many_redirects", f"{args.url} redirected more than {MAX_REDIRECTS} times", url=args.url
            )
        except UnicodeError as exc:
            blocked = SsrfBlocked("bad_idna", args.url, why=f"a redirect named an invalid IDNA host: {exc}")
            return ToolResult.fail("ssrf_blocked", str(blocked), **blocked.detail())
        except httpx.HTTPError as exc:
            return ToolResult.fail("fetch_failed", f"{type(exc).__name__}: {exc}", url=args.url)

    async def _fetch(self, outbound: Outbound, args: Args) -> dict[str, Any]:
        allow = await outbound.allow_list()
        target = outbound.guard(allow).check(args.url)
        headers = {"User-Agent": USER_AGENT, "Accept": "*/*", "Accept-Encoding": "gzip"}
        client = outbound.client(
            allow=allow, timeout=args.timeout_s, follow_redirects=args.follow_redirects, headers=headers
        )
        async with client, client.stream(args.method, target.url) as response:
            body = b"" if args.method == "HEAD" else await _read_capped(response, args.max_bytes)
            mime = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
            output = {
                "url": target.url,
                "final_url": str(response.url),
                "status": response.status_code,
                "reason": response.reason_phrase,
                "redirects": [{"url": str(hop.url), "status": hop.status_code} for hop in response.history],
                "headers": _headers(response),
                "content_type": mime,
                "bytes": len(body),
            }
            if args.method == "GET":
                output.update(_content(body, response, mime))
            return output
