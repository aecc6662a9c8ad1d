"""A new run of a thread is never given a tool call without its result (providers refuse one)."""

from __future__ import annotations

from shared.messages import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage
from worker.start import _answered


def _call(call_id: str) -> ToolCall:
    return ToolCall(id=call_id, name="add", arguments={"a": 1, "b": 2})


def test_an_unanswered_call_is_left_out_with_the_results_of_its_step() -> None:
    done: list[Message] = [
        UserMessage(content="add"),
        AssistantMessage(content=None, tool_calls=[_call("a")]),
        ToolMessage(tool_call_id="a", name="add", content="3"),
        AssistantMessage(content="3"),
    ]
    cut: list[Message] = [
        UserMessage(content="add twice"),
        AssistantMessage(content="adding both", tool_calls=[_call("b"), _call("c")]),
        ToolMessage(tool_call_id="b", name="add", content="3"),  # c never answered: the run ended
    ]
    assert _answered(done) == done
    assert _answered([*done, *cut]) == [
        *done,
        UserMessage(content="add twice"),
        AssistantMessage(content="adding both"),
    ]
