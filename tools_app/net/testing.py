"""Test doubles for the outbound door: a scripted resolver, a connector that records every dial, a local stub server."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpcore
import httpx

LOOPBACK = frozenset({"127.0.0.1", "::1"})
CANNED_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 6\r\nConnection: close\r\n\r\ncanned"


class ScriptedResolver:
    """Answers from a table; a list of answer lists is used in turn (rebinding). Every question is recorded."""

    def __init__(self, table: dict[str, list[str] | list[list[str]]] | None = None):
        self.table = dict(table or {})
        self.questions: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.questions.append((host, port))
        answers = self.table.get(host)
        if answers is None:
            raise httpx.ConnectError(f"could not resolve {host}: not in the test's table")
        if answers and isinstance(answers[0], list):
            turn = sum(1 for asked, _ in self.questions if asked == host) - 1
            return list(answers[min(turn, len(answers) - 1)])
        return list(answers)


class CannedStream(httpcore.AsyncNetworkStream):
    """Stands in for a public server: answers one canned response and remembers what was written and the SNI."""

    def __init__(self, response: bytes):
        self.response = response
        self.written = b""
        self.server_hostname: str | None = None

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        chunk, self.response = self.response[:max_bytes], self.response[max_bytes:]
        return chunk

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.written += buffer

    async def aclose(self) -> None:
        return None

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        self.server_hostname = server_hostname
        return self


@dataclass
class RecordingConnector(httpcore.AsyncNetworkBackend):
    """Records every address handed to it. Loopback is really dialed; any other address gets a canned stream."""

    canned: bytes = CANNED_RESPONSE
    attempts: list[tuple[str, int]] = field(default_factory=list)
    streams: list[CannedStream] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.real = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        self.attempts.append((host, port))
        if host in LOOPBACK:
            return await self.real.connect_tcp(host, port, timeout=timeout, socket_options=socket_options)
        stream = CannedStream(self.canned)
        self.streams.append(stream)
        return stream

    async def connect_unix_socket(self, path: str, timeout=None, socket_options=None) -> httpcore.AsyncNetworkStream:
        raise AssertionError("the guard must never ask for a unix socket")

    async def sleep(self, seconds: float) -> None:
        await self.real.sleep(seconds)


Route = Callable[[BaseHTTPRequestHandler], None]


@dataclass
class Seen:
    method: str
    path: str
    host: str | None
    sni: str | None


class StubServer:
    """A threaded HTTP(S) server on 127.0.0.1 (or ::1) and a free port; routes map a path to a handler function."""

    def __init__(self, routes: dict[str, Route], *, tls: ssl.SSLContext | None = None, host: str = "127.0.0.1"):
        self.routes = routes
        self.seen: list[Seen] = []
        self.stop = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):
                return None

            def _serve(self):
                sni = getattr(self.connection, "aleph_sni", None)
                stub.seen.append(Seen(self.command, self.path, self.headers.get("Host"), sni))
                route = stub.routes.get(self.path.split("?", 1)[0])
                if route is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                try:
                    route(self)
                except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                    self.close_connection = True

            do_GET = _serve
            do_HEAD = _serve

        server_class = ThreadingHTTPServer
        if ":" in host:

            class IPv6Server(ThreadingHTTPServer):
                address_family = socket.AF_INET6

            server_class = IPv6Server
        self.server = server_class((host, 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:

            def remember_sni(sock, server_name, context):
                sock.aleph_sni = server_name

            tls.sni_callback = remember_sni
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.host = host
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, path: str = "/", *, scheme: str = "http", host: str | None = None) -> str:
        name = host or (f"[{self.host}]" if ":" in self.host else self.host)
        return f"{scheme}://{name}:{self.port}{path}"

    def __enter__(self) -> StubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def respond(handler: BaseHTTPRequestHandler, status: int, body: bytes = b"", **headers: str) -> None:
    """Send a whole response; header names are given with underscores (content_type=...)."""
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name.replace("_", "-").title(), value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)
