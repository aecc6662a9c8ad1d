"""Anthropic Messages wire format, whole answers and streams, against the fake server."""

from __future__ import annotations

import pytest

from shared.errors import ConfigError, ModelTransport
from shared.llm.anthropic import AnthropicAdapter, wire_conversation
from shared.llm.base import RawToolCall, Usage
from shared.messages import AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from tests.fakeproviders import FakeToolCall, Reply
from tests.unit.llm.support import API_KEY, WEATHER, Harness, drain, request


def test_complete_text_and_request_format(harness: Harness) -> None:
    fake, adapter = harness.pair("anthropic", Reply(text="Grüße 🌍", input_tokens=40, output_tokens=5))
    response = adapter.complete(
        request(
            SystemMessage(content="Be terse."),
            UserMessage(content="Hallo"),
            SystemMessage(content="Answer in German."),
            temperature=0.0,
        )
    )
    assert response.text == "Grüße 🌍"
    assert response.usage == Usage(input_tokens=40, output_tokens=5)
    assert response.finish_reason == "end_turn"
    (sent,) = fake.requests
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == API_KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    assert sent.body == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,  # mandatory in this API: the adapter's default
        "system": "Be terse.\n\nAnswer in German.",
        "messages": [{"role": "user", "content": "Hallo"}],
        "temperature": 0.0,
    }


def test_request_max_tokens_wins(harness: Harness) -> None:
    fake, adapter = harness.pair("anthropic", Reply(text="ok"))
    adapter.complete(request(max_tokens=123))
    assert fake.requests[0].body["max_tokens"] == 123


def test_tool_round_trip(harness: Harness) -> None:
    fake, adapter = harness.pair(
        "anthropic",
        Reply(
            text="Let me check.", tool_calls=[FakeToolCall("get_weather", {"city": "Zürich"}, id="toolu_01A")]
        ),
        Reply(text="12°C and rainy."),
    )
    first = adapter.complete(request(UserMessage(content="Weather?"), tools=[WEATHER]))
    assert first.text == "Let me check."
    assert first.finish_reason == "tool_use"
    # A whole answer's input is an object and is passed on as one.
    assert first.tool_calls == [RawToolCall(id="toolu_01A", name="get_weather", arguments={"city": "Zürich"})]

    followup = request(
        UserMessage(content="Weather?"),
        AssistantMessage(
            content="Let me check.",
            tool_calls=[
                ToolCall(id="toolu_01A", name="get_weather", arguments={"city": "Zürich"}),
                ToolCall(id="toolu_01B", name="get_weather", arguments={"city": "Bern"}),
            ],
        ),
        ToolMessage(tool_call_id="toolu_01A", name="get_weather", content="12°C, rain"),
        ToolMessage(tool_call_id="toolu_01B", name="get_weather", content="no such station", is_error=True),
        tools=[WEATHER],
    )
    assert adapter.complete(followup).text == "12°C and rainy."
    first_sent, second_sent = fake.requests
    assert first_sent.body["tools"] == [
        {
            "name": "get_weather",
            "description": "Current weather for a city",
            "input_schema": WEATHER.parameters,
        }
    ]
    assert second_sent.body["messages"] == [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_01A", "name": "get_weather", "input": {"city": "Zürich"}},
                {"type": "tool_use", "id": "toolu_01B", "name": "get_weather", "input": {"city": "Bern"}},
            ],
        },
        {
            "role": "user",  # both results in one user message, as the API requires
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01A",
                    "content": "12°C, rain",
                    "is_error": False,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01B",
                    "content": "no such station",
                    "is_error": True,
                },
            ],
        },
    ]


def test_user_text_after_tool_results_joins_their_message() -> None:
    system, messages = wire_conversation(
        [
            UserMessage(content="go"),
            AssistantMessage(tool_calls=[ToolCall(id="t1", name="x", arguments={})]),
            ToolMessage(tool_call_id="t1", name="x", content="done"),
            UserMessage(content="and now?"),
            AssistantMessage(content=None),  # empty: the API refuses empty content, so it is dropped
        ]
    )
    assert system is None
    assert messages == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "done", "is_error": False},
                {"type": "text", "text": "and now?"},
            ],
        },
    ]


def test_stream_text(harness: Harness) -> None:
    text = "Streaming ünïcode 🌍 over awkward chunks, " * 3
    fake, adapter = harness.pair("anthropic", Reply(text=text, input_tokens=17, output_tokens=33))
    deltas, final = drain(adapter.stream(request()))
    assert "".join(deltas) == text
    assert len(deltas) > 10
    assert final.text == text
    assert final.usage == Usage(input_tokens=17, output_tokens=33)  # message_start + message_delta
    assert final.finish_reason == "end_turn"
    assert fake.requests[0].body["stream"] is True


def test_stream_tool_calls_keep_partial_json_text(harness: Harness) -> None:
    calls = [
        FakeToolCall("get_weather", {"city": "Zürich"}, id="toolu_1"),
        FakeToolCall("get_weather", {}, id="toolu_2"),
    ]
    _, adapter = harness.pair("anthropic", Reply(text="Both:", tool_calls=calls))
    deltas, final = drain(adapter.stream(request(tools=[WEATHER])))
    assert "".join(deltas) == "Both:"
    assert final.finish_reason == "tool_use"
    # A stream's input arrives as JSON text and is passed on as that text.
    assert final.tool_calls == [
        RawToolCall(id="toolu_1", name="get_weather", arguments='{"city": "Zürich"}'),
        RawToolCall(id="toolu_2", name="get_weather", arguments="{}"),
    ]


def test_streamed_tool_with_only_empty_input_deltas_gets_the_start_input() -> None:
    from shared.llm.anthropic import _Event, _StreamAssembler

    assembler = _StreamAssembler()
    for event in (
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "t", "name": "n", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": ""},
        },
        {"type": "content_block_stop", "index": 0},
    ):
        assembler.add(_Event.model_validate(event))
    assert assembler.response().tool_calls == [RawToolCall(id="t", name="n", arguments={})]


def test_overloaded_error_event_is_retryable(harness: Harness) -> None:
    from tests.fakeproviders import Fault

    _, adapter = harness.pair("anthropic", Reply(text="a long answer " * 4, fault=Fault.ERROR_EVENT))
    with pytest.raises(ModelTransport, match="overloaded_error") as info:
        drain(adapter.stream(request()))
    assert info.value.retryable is True


def test_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    with AnthropicAdapter.from_env("claude-sonnet-4-5") as adapter:
        assert adapter.base_url == "https://api.anthropic.com"
        assert API_KEY not in repr(adapter)
    with AnthropicAdapter.from_env(
        "m", environ={"ANTHROPIC_API_KEY": "k" * 20, "ANTHROPIC_BASE_URL": "http://h:1"}
    ) as a:
        assert a.base_url == "http://h:1"


def test_from_env_without_key_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="set ANTHROPIC_API_KEY"):
        AnthropicAdapter.from_env("claude", environ={})
