"""A new run of a thread is never given a tool call without its result (providers refuse one), and
never loses an effect an earlier run's call had: a call that ran is answered by its recorded result."""

from __future__ import annotations

from shared.messages import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage
from shared.state import ToolResult
from worker.start import NO_RESULT, _answered


def _call(call_id: str) -> ToolCall:
    return ToolCall(id=call_id, name="add", arguments={"a": 1, "b": 2})


DONE: list[Message] = [
    UserMessage(content="add"),
    AssistantMessage(content=None, tool_calls=[_call("a")]),
    ToolMessage(tool_call_id="a", name="add", content="3"),
    AssistantMessage(content="3"),
]


def test_a_whole_conversation_is_kept_as_it_is() -> None:
    assert _answered(DONE) == DONE
    assert _answered(DONE, {"a": ToolResult(call_id="a", name="add", ok=True, output="9")}) == DONE


def test_calls_stopped_before_their_results_were_observed_get_their_recorded_results() -> None:
    # The run was interrupted after both calls ran and before it observed them: the results are
    # recorded for the run, not in its messages. The next run must see both effects.
    cut: list[Message] = [
        UserMessage(content="add twice"),
        AssistantMessage(content="adding", tool_calls=[_call("b"), _call("c")]),
    ]
    recorded = {
        "b": ToolResult(call_id="b", name="add", ok=True, output="3"),
        "c": ToolResult(call_id="c", name="add", ok=False, output="add failed"),
    }
    assert _answered([*DONE, *cut], recorded) == [
        *DONE,
        *cut,
        ToolMessage(tool_call_id="b", name="add", content="3"),
        ToolMessage(tool_call_id="c", name="add", content="add failed", is_error=True),
    ]


def test_a_call_without_a_recorded_result_is_answered_as_unknown() -> None:
    cut: list[Message] = [
        UserMessage(content="add twice"),
        AssistantMessage(content=None, tool_calls=[_call("b"), _call("c")]),
    ]
    recorded = {"b": ToolResult(call_id="b", name="add", ok=True, output="3")}
    assert _answered([*DONE, *cut], recorded)[len(DONE) + 2 :] == [
        ToolMessage(tool_call_id="b", name="add", content="3"),
        ToolMessage(tool_call_id="c", name="add", content=NO_RESULT, is_error=True),
    ]
