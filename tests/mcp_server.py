"""A real MCP server for the tests, written with the SDK's own server API (FastMCP).

    python -m tests.mcp_server stdio            # over stdin/stdout
    python -m tests.mcp_server http PORT        # streamable HTTP on 127.0.0.1:PORT/mcp

Every call of ``count`` adds one to ``test:mcp_calls`` in the Redis at ``WESICHAIN_REDIS_URL``
(when set), so tests can tell how often a call really reached the server.
"""

from __future__ import annotations

import os
import sys
import time

import redis
from mcp.server.fastmcp import FastMCP

server = FastMCP("wesichain-test", host="127.0.0.1")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def shout(text: str) -> str:
    """The text in capitals."""
    return text.upper()


@server.tool()
def explode(reason: str) -> str:
    """Always fails, with the reason."""
    raise ValueError(f"exploded: {reason}")


@server.tool()
def sleep(seconds: float) -> str:
    """Sleep, then say so."""
    time.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def count(key: str) -> int:
    """Count a call under key (in the tests' Redis)."""
    url = os.environ.get("WESICHAIN_REDIS_URL")
    if not url:
        return 0
    return int(redis.Redis.from_url(url).hincrby("test:mcp_calls", key, 1))


def main() -> None:
    if sys.argv[1] == "http":
        server.settings.port = int(sys.argv[2])
        server.run(transport="streamable-http")
    else:
        server.run(transport="stdio")


if __name__ == "__main__":
    main()
