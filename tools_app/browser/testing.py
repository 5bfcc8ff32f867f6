"""A loopback page server for browser tests and benchmarks: static pages from a directory, a few dynamic routes."""

from __future__ import annotations

import email.parser
import email.policy
import html
import json
import mimetypes
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from ..chokepoint.base import ToolContext, ToolResult


@dataclass
class Hit:
    method: str
    path: str
    headers: dict[str, str]


def _multipart(content_type: str, body: bytes) -> list[tuple[str, str]]:
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body
    )
    fields = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition") or ""
        filename = part.get_filename()
        payload = part.get_payload(decode=True) or b""
        if filename is not None:
            fields.append((name, f"{filename} ({len(payload)} bytes): {payload[:200].decode(errors='replace')}"))
        else:
            fields.append((name, payload.decode(errors="replace")))
    return fields


class PageServer:
    """Serves `root` on 127.0.0.1 and a free port; remembers every request it answered."""

    def __init__(self, root: Path):
        self.root = root.resolve()
        self.hits: list[Hit] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):
                return None

            def _send(self, status: int, body: bytes, content_type: str = "text/html; charset=utf-8", **headers):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for name, value in headers.items():
                    for item in value if isinstance(value, list) else [value]:
                        self.send_header(name.replace("_", "-"), item)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _page(self, title: str, items: list[tuple[str, str]]) -> bytes:
                rows = "".join(f"<li>{html.escape(k)} = {html.escape(v)}</li>" for k, v in items)
                return f"<!doctype html><title>{html.escape(title)}</title><h1>{title}</h1><ul>{rows}</ul>".encode()

            def _serve(self):
                url = urlsplit(self.path)
                server.hits.append(Hit(self.command, self.path, dict(self.headers.items())))
                query = parse_qsl(url.query)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                route = url.path
                if route == "/submit":
                    kind = self.headers.get("Content-Type", "")
                    fields = _multipart(kind, body) if kind.startswith("multipart/") else parse_qsl(body.decode())
                    self._send(200, self._page(f"Submitted by {self.command}", fields + query))
                elif route == "/set-cookie":
                    cookies = [f"{k}={v}; Path=/; Max-Age=86400" for k, v in query]
                    self._send(200, self._page("Cookie set", query), Set_Cookie=cookies)
                elif route == "/cookies":
                    raw = self.headers.get("Cookie", "")
                    pairs = [tuple(c.strip().split("=", 1)) for c in raw.split(";") if "=" in c]
                    self._send(200, self._page("Cookies", sorted(pairs)))
                elif route == "/redirect":
                    target = dict(query).get("to", "/")
                    status = int(dict(query).get("status", "302"))
                    cookie = dict(query).get("cookie")
                    extra = {"Set_Cookie": f"{cookie}; Path=/"} if cookie else {}
                    self._send(status, b"", Location=target, **extra)
                elif route == "/slow":
                    time.sleep(float(dict(query).get("s", "1")))
                    self._send(200, self._page("Slow", query))
                elif route == "/api/data":
                    self._send(200, json.dumps({"items": [1, 2, 3]}).encode(), "application/json")
                else:
                    self._static(route)

            def _static(self, route: str):
                path = (server.root / route.lstrip("/")).resolve()
                if path.is_dir():
                    path = path / "index.html"
                if not path.is_relative_to(server.root) or not path.is_file():
                    self._send(404, b"<!doctype html><title>Not found</title><h1>Not found</h1>")
                    return
                kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
                if kind.startswith("text/") or kind == "application/javascript":
                    kind += "; charset=utf-8"
                self._send(200, path.read_bytes(), kind)

            def _answer(self):
                try:
                    self._serve()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            do_GET = _answer
            do_POST = _answer
            do_HEAD = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.origin = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, path: str = "/") -> str:
        return f"{self.origin}{path}"

    def __enter__(self) -> PageServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def ref_of(snapshot: str, role: str, name: str | None = None) -> str:
    """The ref of the first element with this role whose accessible name (or text) is `name`, in a browser_snapshot."""
    line = re.compile(
        rf'^\s*- {re.escape(role)}(?: "(?P<name>(?:[^"\\]|\\.)*)")?[^\n]*?'
        r"\[ref=(?P<ref>[A-Za-z0-9]+)\][^\n:]*(?::(?: (?P<text>.*))?)?$",
        re.M,
    )
    for match in line.finditer(snapshot):
        if name is None or name in (match.group("name"), match.group("text")):
            return match.group("ref")
    raise LookupError(f"no {role} {name!r} in the snapshot:\n{snapshot}")


class ToolDriver:
    """Calls the browser tools as one agent's session would, straight through `BaseTool.run` (no chokepoint)."""

    def __init__(self, runtime: Any, *, agent_id: int = 1, agent_name: str = "builder", session_key: str | None = None):
        from ..builtin.browser import BROWSER_TOOLS

        self.tools = {cls.name: cls(browser=runtime) for cls in BROWSER_TOOLS}
        self.context = ToolContext(
            call_id="test",
            agent_id=agent_id,
            agent_name=agent_name,
            channel_name="ops",
            session_key=session_key,
            attended=True,
        )

    async def __call__(self, tool_name: str, /, **arguments: Any) -> ToolResult:
        tool = self.tools[tool_name]
        return await tool.run(tool.parse(arguments), self.context)

    async def ok(self, tool_name: str, /, **arguments: Any) -> dict[str, Any]:
        result = await self(tool_name, **arguments)
        assert result.success, f"{tool_name}({arguments}) failed: {result.error}"
        return result.output
