"""A hand-written stdio JSON-RPC MCP server (no SDK): it lists what an SDK server would refuse to send.

Its tools include one whose input schema is not an object (to be quarantined) and two whose names map to the
same bridged name (a collision). PEER_MODE_FILE may hold "hang" (answer nothing after the handshake).
"""

import json
import os
import sys
from pathlib import Path

TOOLS = [
    {
        "name": "ok_tool",
        "description": "Echo x.",
        "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}},
    },
    {
        "name": "bad_schema",
        "description": "Takes an array.",
        "inputSchema": {"type": "array", "items": {"type": "string"}},
    },
    {"name": "a.b", "description": "First holder of raw__a_b.", "inputSchema": {"type": "object"}},
    {"name": "a_b", "description": "Collides with a.b.", "inputSchema": {"type": "object"}},
]


def reply(message_id, result=None, error=None):
    body = {"jsonrpc": "2.0", "id": message_id}
    body.update({"error": error} if error else {"result": result})
    sys.stdout.write(json.dumps(body) + "\n")
    sys.stdout.flush()


def main() -> None:
    mode_file = os.environ.get("PEER_MODE_FILE")
    hang = mode_file and Path(mode_file).exists() and Path(mode_file).read_text().strip() == "hang"
    initialized = False
    for line in sys.stdin:
        message = json.loads(line)
        method, message_id = message.get("method"), message.get("id")
        if message_id is None:
            continue
        if hang and initialized:
            continue
        if method == "initialize":
            initialized = True
            reply(
                message_id,
                {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "raw", "version": "1"},
                },
            )
        elif method == "tools/list":
            reply(message_id, {"tools": TOOLS})
        elif method == "tools/call":
            params = message.get("params") or {}
            text = json.dumps({"tool": params.get("name"), "arguments": params.get("arguments")})
            reply(message_id, {"content": [{"type": "text", "text": text}]})
        else:
            reply(message_id, error={"code": -32601, "message": f"Method not found: {method}"})


if __name__ == "__main__":
    main()
