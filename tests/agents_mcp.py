"""Agents whose tools come from real MCP servers (``tests/mcp_server.py``), over stdio and HTTP.

The HTTP server's URL comes from ``WESICHAIN_TEST_MCP_URL`` (the test starts the server first);
the stdio server is started by each call. Tools are listed when this module is imported.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from shared.agents import Agent, AgentRegistry
from shared.llm.base import ModelResponse
from shared.llm.scripted import ScriptedModel, reply
from shared.mcp_tools import McpServer, mcp_tools
from shared.messages import Message, ToolMessage, UserMessage
from shared.policy import Policy, Reprompt
from shared.tools import ToolSet

STDIO = McpServer(
    "local",
    command=[sys.executable, "-m", "tests.mcp_server", "stdio"],
    env={
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": os.getcwd(),
        "WESICHAIN_REDIS_URL": os.environ.get("WESICHAIN_REDIS_URL", ""),
    },
    timeout_s=30,
)
HTTP = McpServer(
    "remote", url=os.environ.get("WESICHAIN_TEST_MCP_URL", "http://127.0.0.1:9/mcp"), timeout_s=30
)
#: The same server with a short timeout, declared retry-safe (its sleep has no effect to repeat).
HTTP_QUICK = McpServer("remote_quick", url=HTTP.url, timeout_s=1.5, retry_safe=True)


def _script(messages: Sequence[Message]) -> ModelResponse:
    """The user message is a JSON list of calls for the first step; then the results are the answer."""
    results = [m for m in messages if isinstance(m, ToolMessage)]
    user = next(m.content for m in messages if isinstance(m, UserMessage))
    corrections = [m for m in messages[2:] if isinstance(m, UserMessage)]
    if corrections:
        return reply(f"corrected after: {corrections[-1].content[:2000]}")
    if not results:
        return reply(None, *[(c["name"], c["arguments"]) for c in json.loads(user)])
    return reply(" | ".join(f"{m.name}:{'err' if m.is_error else 'ok'}:{m.content}" for m in results))


registry = AgentRegistry()
registry.add_model("mcp", ScriptedModel(_script))
_TOOLS = ToolSet(
    [
        *mcp_tools(STDIO, include=["add", "explode", "count"], prefix="local_"),
        *mcp_tools(HTTP),
        *mcp_tools(HTTP_QUICK, include=["sleep"], prefix="quick_"),
    ]
)
registry.add(
    Agent(
        name="mcp",
        model="scripted:mcp",
        system_prompt="You use MCP tools.",
        tools=_TOOLS,
        policy=Policy(on_invalid_action=Reprompt(n=1)),
    )
)
