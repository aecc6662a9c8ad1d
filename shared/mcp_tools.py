"""Tools from Model Context Protocol servers, through the official ``mcp`` SDK.

Declare the servers an agent uses; their tools are listed once, when the agents module builds
the agent, and each becomes a tool like any other (its name, description and JSON schema shown to
the model, its arguments validated against that schema before a call)::

    files = McpServer("files", command=["python", "-m", "my_mcp_server"])          # stdio
    search = McpServer("search", url="http://search:8000/mcp", timeout_s=20)       # streamable HTTP
    Agent(..., tools=ToolSet([*mcp_tools(files), *mcp_tools(search, include=["query"])]))

A call opens a session to its server (a stdio server is started for the call and stopped after
it), calls the tool within ``timeout_s``, and gives up at once when the run is cancelled. A result
the server marks as an error, a timeout, a transport failure or a protocol error raises, so the
call is recorded as a failed tool call (``ToolDispatch``) that the policy handles. MCP tools are
not retry-safe (a worker lost mid-call makes the outcome unknown) unless the server is declared
``retry_safe=True``.
"""

from __future__ import annotations

import asyncio
import json
import queue
import re
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import jsonschema
from pydantic import BaseModel, RootModel, TypeAdapter, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from shared.errors import ConfigError
from shared.llm.base import ToolSpec
from shared.tools import Tool, ToolContext

__all__ = ["McpArguments", "McpCallError", "McpServer", "McpTool", "list_server_tools", "mcp_tools"]

_NAME = re.compile(r"[^A-Za-z0-9_-]")


class McpCallError(Exception):
    """An MCP tool call that did not give a result: the server said it failed, or it was cancelled."""


@dataclass(frozen=True)
class McpServer:
    """One MCP server: a command to run over stdio, or a streamable-HTTP URL."""

    name: str
    command: Sequence[str] = ()
    url: str | None = None
    #: Environment of a stdio server (None: the SDK's default, a few safe variables).
    env: Mapping[str, str] | None = None
    #: Headers of every HTTP request (an API key, say).
    headers: Mapping[str, str] | None = None
    #: The longest a call may take.
    timeout_s: float = 30.0
    #: Whether calling a tool again after an unknown outcome is safe (MCP does not say).
    retry_safe: bool = False

    def __post_init__(self) -> None:
        if bool(self.command) == (self.url is not None):
            raise ConfigError(f"MCP server {self.name!r}: give exactly one of command (stdio) and url (HTTP)")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"MCP server {self.name!r}: url must be http(s), got {self.url!r}")
        if not 0 < self.timeout_s <= 3600:
            raise ConfigError(f"MCP server {self.name!r}: timeout_s must be in (0, 3600]")


class McpArguments(RootModel[dict[str, Any]]):
    """An MCP tool call's arguments, validated against the tool's own JSON schema."""


@dataclass(frozen=True)
class McpTool(Tool):
    """A tool of an MCP server, exposed like a native tool."""

    server: McpServer | None = None
    remote_name: str = ""
    schema: dict[str, Any] = field(default_factory=dict)

    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.schema)

    def validate(self, arguments: dict[str, Any]) -> BaseModel:
        validator = jsonschema.validators.validator_for(self.schema)(self.schema)
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        if errors:
            details = [
                InitErrorDetails(
                    type=PydanticCustomError("mcp_schema", "{reason}", {"reason": e.message[:300]}),
                    loc=tuple(e.absolute_path),
                    input=e.instance,
                )
                for e in errors[:5]
            ]
            raise ValidationError.from_exception_data(self.name, details)
        return McpArguments(arguments)

    def invoke(self, args: BaseModel, ctx: ToolContext) -> str:
        """Call the tool on its server; give it up at once when the run is cancelled.

        The session runs on its own thread: closing a session whose call is still out waits for
        the server, so a cancelled call is abandoned there (it ends with its timeout) instead.
        """
        if self.server is None:
            raise ConfigError(f"MCP tool {self.name!r} has no server")
        arguments = args.root if isinstance(args, McpArguments) else args.model_dump(mode="json")
        outcome: queue.Queue[tuple[str | None, BaseException | None]] = queue.Queue()

        def call() -> None:
            try:
                outcome.put((asyncio.run(self._call(arguments)), None))
            except BaseException as exc:  # handed to the calling thread
                outcome.put((None, exc))

        threading.Thread(target=call, name=f"mcp-{self.name}", daemon=True).start()
        while True:
            try:
                text, error = outcome.get(timeout=0.1)
            except queue.Empty:
                if ctx.cancelled():
                    raise McpCallError(
                        f"the call of {self.remote_name!r} was given up: the run was cancelled"
                    ) from None
                continue
            if error is not None:
                raise error
            return text or ""

    async def _call(self, arguments: dict[str, Any]) -> str:
        assert self.server is not None  # checked by invoke
        async with _session(self.server) as session:
            result = await session.call_tool(
                self.remote_name, arguments, read_timeout_seconds=timedelta(seconds=self.timeout_s)
            )
        text = "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")
        if result.isError:
            raise McpCallError(f"{self.server.name}/{self.remote_name} failed: {text or 'no detail'}"[:2000])
        if result.structuredContent is not None and not text:
            return json.dumps(result.structuredContent)
        return text


@asynccontextmanager
async def _session(server: McpServer) -> AsyncIterator[Any]:
    """An initialised client session with ``server`` (the SDK's stdio or streamable-HTTP client)."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamablehttp_client

    if server.url is not None:
        async with (
            streamablehttp_client(
                server.url, headers=dict(server.headers or {}), timeout=server.timeout_s
            ) as (
                read,
                write,
                _,
            ),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session
        return
    params = StdioServerParameters(
        command=server.command[0],
        args=list(server.command[1:]),
        env=dict(server.env) if server.env is not None else None,
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def _list(server: McpServer) -> list[Any]:
    async with _session(server) as session:
        return list((await asyncio.wait_for(session.list_tools(), server.timeout_s)).tools)


def list_server_tools(server: McpServer) -> list[Any]:
    """The tools ``server`` offers (``mcp.types.Tool``), or ConfigError saying why they cannot be had."""
    try:
        # Bounded as a whole: a server that starts but never answers must not hang the import.
        return asyncio.run(asyncio.wait_for(_list(server), server.timeout_s + 30))
    except Exception as exc:
        raise ConfigError(
            f"cannot list the tools of MCP server {server.name!r}: {type(exc).__name__}: {exc}"
        ) from None


def mcp_tools(server: McpServer, *, include: Sequence[str] | None = None, prefix: str = "") -> list[McpTool]:
    """The tools of ``server`` as tools of an agent (only ``include``'s, if given), named
    ``prefix + name``; each tool's JSON schema is checked to be a valid schema of an object."""
    tools = []
    for remote in list_server_tools(server):
        if include is not None and remote.name not in include:
            continue
        schema = dict(remote.inputSchema or {"type": "object"})
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ConfigError(
                f"MCP tool {server.name}/{remote.name}: invalid JSON schema: {exc.message}"
            ) from None
        if schema.get("type") != "object":
            raise ConfigError(f"MCP tool {server.name}/{remote.name}: arguments must be a JSON object")
        name = _NAME.sub("_", prefix + remote.name)[:64]
        tools.append(
            McpTool(
                name=name,
                description=(remote.description or f"{remote.name} (MCP server {server.name})")[:2000],
                args_model=McpArguments,
                result_adapter=_TEXT,
                fn=_not_local,
                takes_context=True,
                retry_safe=server.retry_safe,
                timeout_s=server.timeout_s,
                server=server,
                remote_name=remote.name,
                schema=schema,
            )
        )
    missing = sorted(set(include or ()) - {t.remote_name for t in tools})
    if missing:
        raise ConfigError(f"MCP server {server.name!r} has no tool(s) {', '.join(missing)}")
    return tools


_TEXT: TypeAdapter[str] = TypeAdapter(str)


def _not_local(args: Any, ctx: ToolContext) -> str:
    raise RuntimeError("an MCP tool runs on its server")
