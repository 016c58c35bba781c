"""ragline's MCP server: tools and resources over the query pipeline (/mcp) or the HTTP API (stdio)."""
