"""MCP tool declarations and argument validation against a tool's own JSON schema (no server)."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from shared.errors import ConfigError
from shared.mcp_tools import McpArguments, McpServer, McpTool, mcp_tools
from shared.tools import validation_summary

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["a"],
}


def _tool() -> McpTool:
    server = McpServer("s", url="http://127.0.0.1:1/mcp")
    return McpTool(
        name="t",
        description="d",
        args_model=McpArguments,
        result_adapter=TypeAdapter(str),
        fn=lambda args, ctx: "",
        takes_context=True,
        retry_safe=False,
        server=server,
        remote_name="t",
        schema=SCHEMA,
    )


def test_arguments_are_validated_against_the_tools_schema() -> None:
    tool = _tool()
    assert tool.validate({"a": 1, "tags": ["x"]}).model_dump(mode="json") == {"a": 1, "tags": ["x"]}
    with pytest.raises(ValidationError) as caught:
        tool.validate({"a": "one", "tags": [1]})
    assert (
        validation_summary(caught.value)
        == "a: 'one' is not of type 'integer'; tags.0: 1 is not of type 'string'"
    )
    assert tool.spec().parameters == SCHEMA


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({}, "exactly one of command"),
        ({"command": ["x"], "url": "http://h/mcp"}, "exactly one of command"),
        ({"url": "ftp://h"}, "must be http"),
        ({"command": ["x"], "timeout_s": 0}, "timeout_s"),
    ],
)
def test_a_bad_server_declaration_is_a_config_error(kwargs: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        McpServer("s", **kwargs)  # type: ignore[arg-type]


def test_an_unreachable_server_is_a_config_error_when_its_tools_are_listed() -> None:
    with pytest.raises(ConfigError, match="cannot list the tools of MCP server 'gone'"):
        mcp_tools(McpServer("gone", url="http://127.0.0.1:9/mcp", timeout_s=2))
