"""Real MCP servers the suite connects to: an MCPServer (stdio or HTTP) and a hand-written JSON-RPC peer."""
