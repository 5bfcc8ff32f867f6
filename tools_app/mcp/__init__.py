"""MCP on both sides of the chokepoint: servers bridged in as tools, and Aleph served out as an MCP server."""
