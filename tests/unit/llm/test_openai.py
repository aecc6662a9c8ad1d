"""OpenAI Chat Completions wire format, whole answers and streams, against the fake server."""

from __future__ import annotations

import pytest

from shared.errors import ConfigError, ModelTransport
from shared.llm.base import RawToolCall, Usage
from shared.llm.openai import OpenAIAdapter
from shared.messages import AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from tests.fakeproviders import FakeToolCall, Reply
from tests.unit.llm.support import API_KEY, WEATHER, Harness, drain, request

WEATHER_WIRE = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_complete_text_and_request_format(harness: Harness) -> None:
    fake, adapter = harness.pair("openai", Reply(text="Grüße 🌍", input_tokens=31, output_tokens=4))
    response = adapter.complete(
        request(
            SystemMessage(content="Be terse."), UserMessage(content="Hallo"), temperature=0.2, max_tokens=50
        )
    )
    assert response.text == "Grüße 🌍"
    assert response.tool_calls == []
    assert response.usage == Usage(input_tokens=31, output_tokens=4)
    assert response.finish_reason == "stop"
    (sent,) = fake.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {API_KEY}"
    assert sent.headers["content-type"] == "application/json"
    assert sent.body == {
        "model": "gpt-4o-mini",
        "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hallo"}],
        "temperature": 0.2,
        "max_completion_tokens": 50,
    }


def test_tool_round_trip(harness: Harness) -> None:
    fake, adapter = harness.pair(
        "openai",
        Reply(tool_calls=[FakeToolCall("get_weather", {"city": "Zürich"}, id="call_Ab12")]),
        Reply(text="12°C and rainy."),
    )
    first = adapter.complete(request(UserMessage(content="Weather in Zürich?"), tools=[WEATHER]))
    assert first.text is None
    assert first.finish_reason == "tool_calls"
    # Arguments stay the raw JSON text the model produced: the runtime validates them.
    assert first.tool_calls == [
        RawToolCall(id="call_Ab12", name="get_weather", arguments='{"city": "Zürich"}')
    ]

    call = first.tool_calls[0]
    assert call.id is not None
    followup = request(
        UserMessage(content="Weather in Zürich?"),
        AssistantMessage(
            content=None, tool_calls=[ToolCall(id=call.id, name=call.name, arguments={"city": "Zürich"})]
        ),
        ToolMessage(tool_call_id=call.id, name="get_weather", content="12°C, rain"),
        tools=[WEATHER],
    )
    assert adapter.complete(followup).text == "12°C and rainy."
    first_sent, second_sent = fake.requests
    assert first_sent.body["tools"] == [WEATHER_WIRE]
    assert second_sent.body["messages"] == [
        {"role": "user", "content": "Weather in Zürich?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_Ab12",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_Ab12", "content": "12°C, rain"},
    ]


def test_stream_text(harness: Harness) -> None:
    text = "Streaming ünïcode 🌍 over awkward chunks, " * 3
    fake, adapter = harness.pair("openai", Reply(text=text, input_tokens=9, output_tokens=21))
    deltas, final = drain(adapter.stream(request()))
    assert "".join(deltas) == text
    assert len(deltas) > 10  # arrived incrementally
    assert final.text == text
    assert final.usage == Usage(input_tokens=9, output_tokens=21)  # from the include_usage chunk
    assert final.finish_reason == "stop"
    (sent,) = fake.requests
    assert sent.body["stream"] is True
    assert sent.body["stream_options"] == {"include_usage": True}


def test_stream_assembles_tool_calls_by_index(harness: Harness) -> None:
    calls = [
        FakeToolCall("get_weather", {"city": "Zürich", "units": "°C"}, id="call_1"),
        FakeToolCall("get_weather", {"city": "東京"}, id="call_2"),
    ]
    _, adapter = harness.pair("openai", Reply(text="Checking both.", tool_calls=calls))
    deltas, final = drain(adapter.stream(request(tools=[WEATHER])))
    assert "".join(deltas) == "Checking both."
    assert final.text == "Checking both."
    assert final.finish_reason == "tool_calls"
    assert final.tool_calls == [
        RawToolCall(id="call_1", name="get_weather", arguments='{"city": "Zürich", "units": "°C"}'),
        RawToolCall(id="call_2", name="get_weather", arguments='{"city": "東京"}'),
    ]
    assert final.raw is not None and "東京" in final.raw


def test_refusal_is_the_text(harness: Harness) -> None:
    payload = {"choices": [{"index": 0, "message": {"content": None, "refusal": "I can't help."}}]}
    _, adapter = harness.pair("openai", Reply(body=payload))
    assert adapter.complete(request()).text == "I can't help."


def test_in_band_error_in_a_200_body(harness: Harness) -> None:
    _, adapter = harness.pair(
        "openai", Reply(body={"error": {"message": "upstream died", "type": "server_error"}})
    )
    with pytest.raises(ModelTransport, match="upstream died") as info:
        adapter.complete(request())
    assert info.value.retryable is True


def test_answer_without_choices_is_an_error(harness: Harness) -> None:
    _, adapter = harness.pair("openai", Reply(body={"id": "x", "choices": []}))
    with pytest.raises(ModelTransport, match="no choices"):
        adapter.complete(request())


def test_max_tokens_field_for_older_compatible_servers(harness: Harness) -> None:
    fake = harness.fake("openai", Reply(text="ok"))
    adapter = harness.adapter(fake, max_tokens_field="max_tokens")
    adapter.complete(request(max_tokens=7))
    assert fake.requests[0].body["max_tokens"] == 7
    assert "max_completion_tokens" not in fake.requests[0].body


def test_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1/")
    with OpenAIAdapter.from_env("gpt-4o") as adapter:
        assert adapter.model == "gpt-4o"
        assert adapter.base_url == "http://127.0.0.1:9/v1"
        assert API_KEY not in repr(adapter)
    monkeypatch.delenv("OPENAI_BASE_URL")
    with OpenAIAdapter.from_env("gpt-4o") as adapter:
        assert adapter.base_url == "https://api.openai.com/v1"


def test_from_env_without_key_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="set OPENAI_API_KEY"):
        OpenAIAdapter.from_env("gpt-4o", environ={})


def test_rejects_bad_base_url() -> None:
    with pytest.raises(ConfigError, match="http:// or https://"):
        OpenAIAdapter("gpt-4o", api_key=API_KEY, base_url="api.openai.com")


def test_assistant_text_without_calls_is_sent_as_content(harness: Harness) -> None:
    fake, adapter = harness.pair("openai", Reply(text="ok"))
    adapter.complete(
        request(UserMessage(content="a"), AssistantMessage(content="b"), UserMessage(content="c"))
    )
    assert fake.requests[0].body["messages"][1] == {"role": "assistant", "content": "b"}
