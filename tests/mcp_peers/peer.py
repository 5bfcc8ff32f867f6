"""An MCPServer over stdio or streamable HTTP, with annotated, unannotated and slow tools.

`python peer.py stdio` serves stdin/stdout; `python peer.py http [PORT]` binds 127.0.0.1 and prints its port first.
PEER_MODE_FILE names a file whose content picks a misbehaviour at start: "crash" exits at once, "garbage"
writes non-MCP lines, "hang" reads and never answers. PEER_PID_FILE receives the process id.
"""

import asyncio
import os
import socket
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("peer", version="1.0")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
def delete_item(item: str) -> str:
    """Delete an item (pretend)."""
    return f"deleted {item}"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True))
def set_flag(flag: str) -> str:
    """Set a flag: mutating, not destructive, idempotent."""
    return f"set {flag}"


@server.tool()
def mystery(x: str) -> str:
    """A tool that says nothing about itself."""
    return f"mystery {x}"


@server.tool(name="peer:echo")
def echo(text: str) -> str:
    """Echo with a redundant server prefix in its name."""
    return text


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def slow(seconds: float) -> str:
    """Sleep, then answer; records its cancellation in PEER_EVENTS_FILE."""
    events = os.environ.get("PEER_EVENTS_FILE")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        if events:
            with open(events, "a") as handle:
                handle.write("cancelled\n")
        raise
    return f"slept {seconds}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def whoami() -> str:
    """This process's id, so a test can tell a reconnect from the same session."""
    return str(os.getpid())


def misbehave() -> None:
    mode_file = os.environ.get("PEER_MODE_FILE")
    mode = Path(mode_file).read_text().strip() if mode_file and Path(mode_file).exists() else ""
    if mode == "crash":
        print("peer: crashing on purpose", file=sys.stderr, flush=True)
        sys.exit(3)
    if mode == "garbage":
        for line in sys.stdin:
            sys.stdout.write("this is not JSON-RPC <html>\n")
            sys.stdout.flush()
        sys.exit(0)
    if mode == "hang":
        for _line in sys.stdin:
            pass
        time.sleep(3600)


def main() -> None:
    pid_file = os.environ.get("PEER_PID_FILE")
    if pid_file:
        Path(pid_file).write_text(str(os.getpid()))
    misbehave()
    if sys.argv[1] == "http":
        import uvicorn

        # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets that name it, and without it Nagle holds
        # the response body behind its headers for the client's delayed ACK (~40 ms a call).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", int(sys.argv[2]) if len(sys.argv) > 2 else 0))
        print(sock.getsockname()[1], flush=True)
        app = server.streamable_http_app(transport_security=None, host="0.0.0.0")
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
    else:
        server.run(transport="stdio")


if __name__ == "__main__":
    main()
