"""Validation of the model's tool calls: nothing the model says is trusted until it passes here."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from shared.actions import accept_tool_calls
from shared.errors import InvalidModelAction
from shared.llm.base import ModelResponse, RawToolCall
from shared.messages import ToolCall
from shared.settings import Limits
from shared.tools import ToolSet, tool


class AddArgs(BaseModel):
    a: float
    b: float = 2.0


class NoArgs(BaseModel):
    pass


@tool
def add(args: AddArgs) -> float:
    """Add."""
    return args.a + args.b


@tool
def ping(args: NoArgs) -> str:
    """Ping."""
    return "pong"


TOOLS = ToolSet([add, ping])
LIMITS = Limits()


def response(
    *calls: tuple[str | None, str, Any], text: str | None = None, raw: str | None = None
) -> ModelResponse:
    return ModelResponse(
        text=text,
        raw=raw,
        tool_calls=[RawToolCall(id=cid, name=name, arguments=args) for cid, name, args in calls],
    )


def accept(resp: ModelResponse, limits: Limits = LIMITS) -> list[ToolCall]:
    return accept_tool_calls(resp, TOOLS, 4, limits)


def rejected(resp: ModelResponse, limits: Limits = LIMITS) -> InvalidModelAction:
    with pytest.raises(InvalidModelAction) as info:
        accept(resp, limits)
    assert info.value.step == 4
    return info.value


# -- accepted -----------------------------------------------------------------------------------


def test_text_only_reply_has_no_calls() -> None:
    assert accept(response(text="the answer")) == []


def test_dict_and_string_arguments() -> None:
    calls = accept(
        response(
            ("c1", "add", {"a": 1, "b": 3}),
            ("c2", "add", '{"a": 5}'),
            ("c3", "ping", None),
            ("c4", "ping", ""),
            ("c5", "ping", "{}"),
        )
    )
    assert calls == [
        ToolCall(id="c1", name="add", arguments={"a": 1.0, "b": 3.0}),
        ToolCall(id="c2", name="add", arguments={"a": 5.0, "b": 2.0}),
        ToolCall(id="c3", name="ping", arguments={}),
        ToolCall(id="c4", name="ping", arguments={}),
        ToolCall(id="c5", name="ping", arguments={}),
    ]


def test_arguments_are_the_validated_values() -> None:
    # Lax coercion happens at validation; what is stored is the validated, JSON-safe form.
    (call,) = accept(response(("c", "add", {"a": "1.5"})))
    assert call.arguments == {"a": 1.5, "b": 2.0}
    json.dumps(call.arguments)


def test_call_ids_are_made_unique_and_safe() -> None:
    calls = accept(
        response(
            ("x", "ping", {}),
            ("x", "ping", {}),
            ("x", "ping", {}),
            ("a b/../c", "ping", {}),
            (None, "ping", {}),
            ("", "ping", {}),
            ("!!!", "ping", {}),
            ("y" * 100, "ping", {}),
            ("ok-id_1.2", "ping", {}),
        )
    )
    ids = [c.id for c in calls]
    assert ids == ["x", "x_2", "x_3", "a_b_.._c", "call_4", "call_5", "___", "y" * 64, "ok-id_1.2"]
    assert len(set(ids)) == len(ids)


def test_sanitizing_does_not_create_collisions() -> None:
    ids = [c.id for c in accept(response(("a b", "ping", {}), ("a_b", "ping", {}), ("a:b", "ping", {})))]
    assert ids == ["a_b", "a_b_2", "a_b_3"]
    ids = [c.id for c in accept(response(("x", "ping", {}), ("x", "ping", {}), ("x_2", "ping", {})))]
    assert len(set(ids)) == 3 and ids[:2] == ["x", "x_2"]


def test_exactly_at_the_limit_is_accepted() -> None:
    limits = Limits(max_tool_calls_per_step=3)
    assert len(accept(response(*[(f"c{i}", "ping", {}) for i in range(3)]), limits)) == 3


# -- rejected -------------------------------------------------------------------------------------


def test_unknown_tool() -> None:
    err = rejected(response(("c1", "rm_rf", {"path": "/"}), text="sure", raw="RAW"))
    assert err.message == "unknown tool 'rm_rf' (available: add, ping)"
    assert err.tool == "rm_rf"
    assert err.details["args"] == '{"path": "/"}'
    assert err.details["raw"] == "RAW"
    info = err.info()
    assert (info.kind, info.tool, info.step) == ("InvalidModelAction", "rm_rf", 4)


def test_unknown_tool_with_no_tools() -> None:
    with pytest.raises(InvalidModelAction) as info:
        accept_tool_calls(response(("c", "x", {})), ToolSet(), 1, LIMITS)
    assert info.value.message == "unknown tool 'x' (available: none)"


def test_later_unknown_tool_rejects_the_whole_reply() -> None:
    err = rejected(response(("c1", "add", {"a": 1}), ("c2", "nope", {})))
    assert err.tool == "nope"


def test_non_json_string_arguments() -> None:
    err = rejected(response(("c1", "add", '{"a": 1, "b": '), text="thinking"))
    assert err.message.startswith("arguments for 'add' are not valid JSON: ")
    assert err.tool == "add"
    assert err.details["args"] == '{"a": 1, "b": '
    # Without a separate raw field, the reply text is what gets recorded.
    assert err.details["raw"] == "thinking"


@pytest.mark.parametrize(
    ("arguments", "type_name"),
    [
        ("[1, 2]", "list"),
        ('"text"', "str"),
        ("3", "int"),
        ("null", "NoneType"),
        ([1], "list"),
        (7, "int"),
        (True, "bool"),
    ],
)
def test_arguments_that_are_not_an_object(arguments: Any, type_name: str) -> None:
    err = rejected(response(("c1", "add", arguments)))
    assert err.message == f"arguments for 'add' must be a JSON object, got {type_name}"
    assert err.tool == "add"


def test_arguments_failing_validation() -> None:
    err = rejected(response(("c1", "add", {"a": "one", "b": 2})))
    assert err.message.startswith("arguments for 'add' failed validation: a: Input should be a valid number")
    assert err.tool == "add"
    assert json.loads(err.details["args"]) == {"a": "one", "b": 2}
    err = rejected(response(("c1", "add", "{}")))
    assert "a: Field required" in err.message


def test_error_excerpts_are_bounded() -> None:
    huge = "x" * 10_000
    err = rejected(response(("c1", "add", {"a": huge}), raw="R" * 10_000))
    assert len(err.details["args"]) <= 2000 + len("...[truncated]")
    assert err.details["args"].endswith("...[truncated]")
    assert len(err.details["raw"]) < 2100
    info = err.info()
    assert len(json.dumps(info.model_dump())) < 5000

    err = rejected(response(("c1", "nope", huge)))
    assert err.details["args"] == "x" * 2000 + "...[truncated]"


@pytest.mark.parametrize("text", [None, "", "   \n"])
def test_empty_reply(text: str | None) -> None:
    err = rejected(response(text=text))
    assert err.message == "the model returned neither text nor tool calls"


def test_too_many_calls() -> None:
    limits = Limits(max_tool_calls_per_step=2)
    err = rejected(response(*[(f"c{i}", "ping", {}) for i in range(3)], raw="many"), limits)
    assert err.message == "3 tool calls in one step; the limit is 2"
    assert err.details["raw"] == "many"


def test_invalid_action_str_is_its_message() -> None:
    err = rejected(response(("c1", "add", {"a": "one"})))
    assert str(err) == err.message
    assert err.args == (err.message,)
