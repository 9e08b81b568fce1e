"""A small MCP server for the ``mcp`` environment's tests: stdio, or streamable HTTP on loopback."""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer

srv = MCPServer("toolgrpo-test")
counter = {"n": 0}


@srv.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@srv.tool()
def bump() -> str:
    """Count calls in this server process (state the trainer cannot snapshot)."""
    counter["n"] += 1
    return str(counter["n"])


@srv.tool()
def reset() -> str:
    """Forget this process's state between episodes (the pool calls it; the model never sees it)."""
    counter["n"] = 0
    return "ok"


@srv.tool()
def pid() -> str:
    """This server's process id (tells a reused server from a new one)."""
    return str(os.getpid())


@srv.tool()
def boom(x: str) -> str:
    """Always raises."""
    raise RuntimeError(f"boom {x}")


@srv.tool()
def slow(seconds: float) -> str:
    """Sleeps."""
    time.sleep(seconds)
    return "done"


if __name__ == "__main__":
    if len(sys.argv) > 1:
        srv.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
    else:
        srv.run()
