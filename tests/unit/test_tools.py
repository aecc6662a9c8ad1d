"""Typed tools: generated schemas, validation before running, sync/async, result checking."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from pydantic import BaseModel, Field, ValidationError

from shared.errors import ConfigError
from shared.llm.base import ToolSpec
from shared.tools import Tool, ToolContext, ToolSet, tool, validation_summary


class AddArgs(BaseModel):
    a: float
    b: float = Field(default=2, description="second operand")
    tags: list[str] = []


class Point(BaseModel):
    x: int
    y: int


CTX = ToolContext(run_id="run1", step=3, call_id="call_0", deadline=time.time() + 60)


def make_add(calls: list[Any]) -> Tool:
    @tool
    def add(args: AddArgs) -> float:
        """Add two numbers.

        Tags are ignored.
        """
        calls.append(args)
        return args.a + args.b

    return add


def test_schema_is_generated_from_the_args_model() -> None:
    add = make_add([])
    assert add.name == "add"
    assert add.description == "Add two numbers.\n\nTags are ignored."
    assert add.takes_context is False
    assert add.retry_safe is True and add.timeout_s == 60.0
    spec = add.spec()
    assert isinstance(spec, ToolSpec)
    assert spec.name == "add" and spec.description == add.description
    assert spec.parameters == {
        "title": "AddArgs",
        "type": "object",
        "properties": {
            "a": {"title": "A", "type": "number"},
            "b": {"default": 2, "description": "second operand", "title": "B", "type": "number"},
            "tags": {"default": [], "items": {"type": "string"}, "title": "Tags", "type": "array"},
        },
        "required": ["a"],
    }


def test_options_name_retry_safe_timeout() -> None:
    @tool(name="pay", retry_safe=False, timeout_s=5)
    def charge(args: AddArgs, ctx: ToolContext) -> str:
        """Charge."""
        return ctx.idempotency_key

    assert (charge.name, charge.retry_safe, charge.timeout_s, charge.takes_context) == ("pay", False, 5, True)
    assert charge.spec().name == "pay"


def test_arguments_are_validated_before_the_tool_runs() -> None:
    calls: list[Any] = []
    add = make_add(calls)
    for bad in ({}, {"a": "one"}, {"a": 1, "tags": "notalist"}, {"a": [1]}):
        with pytest.raises(ValidationError):
            add.validate(bad)
    assert calls == []
    args = add.validate({"a": "1.5", "b": 2})
    assert isinstance(args, AddArgs) and args.a == 1.5
    assert add.invoke(args, CTX) == "3.5"
    assert calls == [args]


def test_sync_tool_with_context() -> None:
    seen: list[ToolContext] = []

    @tool
    def where(args: Point, ctx: ToolContext) -> Point:
        """Echo the point."""
        seen.append(ctx)
        return Point(x=args.x + 1, y=args.y)

    out = where.invoke(where.validate({"x": 1, "y": 2}), CTX)
    assert json.loads(out) == {"x": 2, "y": 2}
    assert seen == [CTX]


def test_async_tool() -> None:
    import asyncio

    @tool
    async def later(args: Point) -> dict[str, int]:
        """Add the coordinates, asynchronously."""
        await asyncio.sleep(0)
        return {"sum": args.x + args.y}

    assert later.invoke(later.validate({"x": 2, "y": 5}), CTX) == '{"sum":7}'


def test_async_tool_with_context() -> None:
    @tool
    async def key(args: Point, ctx: ToolContext) -> str:
        """Return the idempotency key."""
        return ctx.idempotency_key

    assert key.invoke(key.validate({"x": 0, "y": 0}), CTX) == "run1:3:call_0"


def test_tool_context() -> None:
    flag = {"cancel": False}
    ctx = ToolContext(
        run_id="abc",
        step=7,
        call_id="call_2",
        deadline=time.time() + 30,
        _cancel_check=lambda: flag["cancel"],
    )
    assert ctx.idempotency_key == "abc:7:call_2"
    assert ctx.cancelled() is False
    flag["cancel"] = True
    assert ctx.cancelled() is True
    assert 29 < ctx.remaining_s() <= 30
    assert ToolContext(run_id="a", step=1, call_id="c", deadline=time.time() - 5).remaining_s() == 0.0
    assert ToolContext(run_id="a", step=1, call_id="c", deadline=0).cancelled() is False


def test_result_type_is_checked() -> None:
    @tool
    def wrong(args: Point) -> int:
        """Claims an int, returns text."""
        return "not a number"  # type: ignore[return-value]

    with pytest.raises(ValidationError):
        wrong.invoke(wrong.validate({"x": 1, "y": 1}), CTX)

    @tool
    def wrong_model(args: Point) -> Point:
        """Claims a Point, returns something else."""
        return {"x": "a"}  # type: ignore[return-value]

    with pytest.raises(ValidationError):
        wrong_model.invoke(wrong_model.validate({"x": 1, "y": 1}), CTX)

    @tool
    def not_text(args: Point) -> str:
        """Claims text, returns a number."""
        return 5  # type: ignore[return-value]

    with pytest.raises(ValidationError):
        not_text.invoke(not_text.validate({"x": 1, "y": 1}), CTX)


def test_string_result_is_passed_through_verbatim() -> None:
    text = '{"already": "json"}\n  with "quotes" and ünïcode'

    @tool
    def echo(args: Point) -> str:
        """Return fixed text."""
        return text

    assert echo.invoke(echo.validate({"x": 1, "y": 1}), CTX) == text


def test_non_string_results_are_json() -> None:
    @tool
    def many(args: Point) -> list[Point]:
        """Two points."""
        return [args, Point(x=0, y=0)]

    assert many.invoke(Point(x=1, y=2), CTX) == '[{"x":1,"y":2},{"x":0,"y":0}]'

    @tool
    def flag(args: Point) -> bool:
        """A boolean."""
        return True

    assert flag.invoke(Point(x=1, y=2), CTX) == "true"


def test_tool_exceptions_propagate() -> None:
    @tool
    def boom(args: Point) -> str:
        """Fails."""
        raise RuntimeError("kaput")

    with pytest.raises(RuntimeError, match="kaput"):
        boom.invoke(Point(x=1, y=1), CTX)


# -- rejected definitions --------------------------------------------------------------------------


def test_missing_docstring_is_rejected() -> None:
    def nodoc(args: Point) -> str:
        return ""

    def blank(args: Point) -> str:
        """ """
        return ""

    for fn in (nodoc, blank):
        with pytest.raises(ConfigError, match="needs a docstring"):
            tool(fn)


def test_missing_annotations_are_rejected() -> None:
    def no_arg_annotation(args) -> str:  # type: ignore[no-untyped-def]
        """Doc."""
        return ""

    def no_return(args: Point):  # type: ignore[no-untyped-def]
        """Doc."""
        return ""

    def no_params() -> str:
        """Doc."""
        return ""

    with pytest.raises(ConfigError, match="first parameter must be annotated"):
        tool(no_arg_annotation)
    with pytest.raises(ConfigError, match="return type must be annotated"):
        tool(no_return)
    with pytest.raises(ConfigError, match="first parameter must be annotated"):
        tool(no_params)


def test_args_must_be_a_pydantic_model() -> None:
    def plain(args: dict[str, int]) -> str:
        """Doc."""
        return ""

    def scalar(args: int) -> str:
        """Doc."""
        return ""

    for fn in (plain, scalar):
        with pytest.raises(ConfigError, match="must be a pydantic BaseModel"):
            tool(fn)


def test_too_many_parameters_rejected() -> None:
    def three(args: Point, ctx: ToolContext, extra: int) -> str:
        """Doc."""
        return ""

    with pytest.raises(ConfigError, match="not 3 parameters"):
        tool(three)


@pytest.mark.parametrize("timeout", [0, -1.0])
def test_non_positive_timeout_rejected(timeout: float) -> None:
    def ok(args: Point) -> str:
        """Doc."""
        return ""

    with pytest.raises(ConfigError, match="timeout_s must be > 0"):
        tool(timeout_s=timeout)(ok)


# -- ToolSet ----------------------------------------------------------------------------------------


def test_toolset_rejects_duplicate_names() -> None:
    first = make_add([])
    second = make_add([])
    with pytest.raises(ConfigError, match="duplicate tool name 'add'"):
        ToolSet([first, second])

    @tool(name="add")
    def other(args: Point) -> int:
        """Another add."""
        return 0

    with pytest.raises(ConfigError, match="duplicate tool name 'add'"):
        ToolSet([first, other])


def test_toolset_lookup_and_specs() -> None:
    add = make_add([])

    @tool
    def mul(args: Point) -> int:
        """Multiply."""
        return args.x * args.y

    ts = ToolSet([mul, add])
    assert ts.names == ["mul", "add"]
    assert len(ts) == 2
    assert list(ts) == [mul, add]
    assert ts.get("add") is add and ts.get("nope") is None
    specs = ts.specs()
    assert [s.name for s in specs] == ["mul", "add"]
    specs.clear()  # a copy: the set is immutable
    assert [s.name for s in ts.specs()] == ["mul", "add"]
    assert len(ToolSet()) == 0 and ToolSet().specs() == []


def test_validation_summary() -> None:
    class Many(BaseModel):
        a: int
        b: int
        c: int
        d: int
        e: int
        f: int
        g: int

    with pytest.raises(ValidationError) as info:
        Many.model_validate({"a": "x"})
    summary = validation_summary(info.value)
    assert summary.startswith("a: Input should be a valid integer")
    assert "b: Field required" in summary
    assert summary.endswith("; and 2 more")
    assert validation_summary(info.value, limit=1).endswith("; and 6 more")
