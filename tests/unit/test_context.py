"""Token counting, trimming by whole exchanges, and when a summary is due."""

from __future__ import annotations

import pytest

from shared.context import (
    ContextBudget,
    counter_for,
    estimate_counter,
    exchanges,
    fit,
    message_tokens,
    summary_due,
    with_summary,
)
from shared.errors import ConfigError
from shared.messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolMessage, UserMessage
from shared.state import Summary

COUNT = estimate_counter(3.0)


def _conversation(steps: int) -> list[Message]:
    messages: list[Message] = [SystemMessage(content="sys"), UserMessage(content="question")]
    for i in range(steps):
        calls = [
            ToolCall(id=f"c{i}a", name="t", arguments={"i": i}),
            ToolCall(id=f"c{i}b", name="t", arguments={}),
        ]
        messages.append(AssistantMessage(content=None, tool_calls=calls))
        messages += [ToolMessage(tool_call_id=c.id, name="t", content="r" * 90) for c in calls]
    return messages


def test_counting() -> None:
    assert COUNT("") == 0 and COUNT("abcd") == 2
    assert message_tokens(UserMessage(content="abc"), COUNT) == 5
    openai = counter_for("openai:gpt-4o")
    assert openai("hello world") == 2  # tiktoken (cl100k offline when the encoding cannot be fetched)
    assert counter_for("anthropic:claude-3-5-sonnet")("hello world") == 4  # the estimate


def test_a_call_and_its_results_are_one_exchange() -> None:
    units = exchanges(_conversation(2)[1:])
    assert [len(u) for u in units] == [1, 3, 3]


def test_fit_keeps_the_system_prompt_and_the_newest_whole_exchanges() -> None:
    messages = _conversation(10)
    fitted, used = fit(messages, [], 300, COUNT)
    assert fitted[0] == messages[0] and used <= 300
    assert fitted[-3:] == messages[-3:]
    assert isinstance(fitted[1], AssistantMessage) and len(fitted) % 3 == 1  # whole exchanges only
    # Nothing smaller than the newest exchange can be sent, even over budget.
    tight, used = fit(messages, [], 10, COUNT)
    assert tight == [messages[0], *messages[-3:]] and used > 10


def test_a_summary_is_due_only_over_budget_and_reaches_as_far_as_needed() -> None:
    budget = ContextBudget(max_tokens=400, strategy="summarise", summary_tokens=50)
    assert summary_due(budget, _conversation(2), None, [], COUNT) is None
    messages = _conversation(10)
    due = summary_due(budget, messages, None, [], COUNT)
    assert due is not None
    upto, dropped = due
    assert dropped == messages[1 : 1 + upto] and dropped[0] == UserMessage(content="question")
    kept = with_summary(messages, Summary(upto=upto, text="s"))
    assert isinstance(kept[2], AssistantMessage)  # the tail starts with a whole exchange
    assert summary_due(budget, messages, Summary(upto=upto, text="s"), [], COUNT) is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 10},
        {"max_tokens": 1000, "strategy": "drop"},
        {"max_tokens": 1000, "summary_tokens": 900},
    ],
)
def test_a_bad_budget_is_a_config_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        ContextBudget(**kwargs)  # type: ignore[arg-type]
