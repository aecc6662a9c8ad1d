"""Ollama chat wire format, whole answers and NDJSON streams, against the fake server."""

from __future__ import annotations

import pytest

from shared.errors import ConfigError, ModelTransport
from shared.llm.base import RawToolCall, Usage
from shared.llm.ollama import OllamaAdapter, parse_host
from shared.messages import AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from tests.fakeproviders import FakeToolCall, Fault, Reply
from tests.unit.llm.support import WEATHER, Harness, drain, request


def test_complete_text_and_request_format(harness: Harness) -> None:
    fake, adapter = harness.pair("ollama", Reply(text="Grüße 🌍", input_tokens=26, output_tokens=3))
    response = adapter.complete(
        request(
            SystemMessage(content="Be terse."), UserMessage(content="Hallo"), temperature=0.5, max_tokens=64
        )
    )
    assert response.text == "Grüße 🌍"
    assert response.usage == Usage(input_tokens=26, output_tokens=3)  # prompt_eval_count / eval_count
    assert response.finish_reason == "stop"
    (sent,) = fake.requests
    assert sent.path == "/api/chat"
    assert "authorization" not in sent.headers
    assert sent.body == {
        "model": "llama3.2",
        "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hallo"}],
        "stream": False,  # Ollama streams unless told otherwise
        "options": {"temperature": 0.5, "num_predict": 64},
    }


def test_tool_round_trip(harness: Harness) -> None:
    fake, adapter = harness.pair(
        "ollama",
        Reply(
            tool_calls=[
                FakeToolCall("get_weather", {"city": "Zürich"}),
                FakeToolCall("get_weather", {"city": "Bern"}),
            ]
        ),
        Reply(text="Rain in both."),
    )
    first = adapter.complete(request(UserMessage(content="Weather?"), tools=[WEATHER]))
    # Objects pass through as objects; positional ids stand in for the ids Ollama lacks.
    assert first.tool_calls == [
        RawToolCall(id="call_0", name="get_weather", arguments={"city": "Zürich"}),
        RawToolCall(id="call_1", name="get_weather", arguments={"city": "Bern"}),
    ]
    assert first.text is None

    followup = request(
        UserMessage(content="Weather?"),
        AssistantMessage(
            tool_calls=[
                ToolCall(id="call_0", name="get_weather", arguments={"city": "Zürich"}),
                ToolCall(id="call_1", name="get_weather", arguments={"city": "Bern"}),
            ]
        ),
        ToolMessage(tool_call_id="call_0", name="get_weather", content="12°C, rain"),
        ToolMessage(tool_call_id="call_1", name="get_weather", content="9°C, rain"),
        tools=[WEATHER],
    )
    assert adapter.complete(followup).text == "Rain in both."
    first_sent, second_sent = fake.requests
    assert first_sent.body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER.description,
                "parameters": WEATHER.parameters,
            },
        }
    ]
    assert second_sent.body["messages"] == [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
                {"function": {"name": "get_weather", "arguments": {"city": "Bern"}}},
            ],
        },
        {"role": "tool", "content": "12°C, rain", "tool_name": "get_weather"},
        {"role": "tool", "content": "9°C, rain", "tool_name": "get_weather"},
    ]


def test_stream_text(harness: Harness) -> None:
    text = "Streaming ünïcode 🌍 over awkward chunks, " * 3
    fake, adapter = harness.pair("ollama", Reply(text=text, input_tokens=5, output_tokens=30))
    deltas, final = drain(adapter.stream(request()))
    assert "".join(deltas) == text
    assert len(deltas) > 10
    assert final.text == text
    assert final.usage == Usage(input_tokens=5, output_tokens=30)
    assert fake.requests[0].body["stream"] is True


def test_stream_tool_calls(harness: Harness) -> None:
    _, adapter = harness.pair("ollama", Reply(tool_calls=[FakeToolCall("get_weather", {"city": "東京"})]))
    deltas, final = drain(adapter.stream(request(tools=[WEATHER])))
    assert deltas == []
    assert final.text is None
    assert final.tool_calls == [RawToolCall(id="call_0", name="get_weather", arguments={"city": "東京"})]


def test_provider_ids_are_kept_when_sent(harness: Harness) -> None:
    body = {
        "message": {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "abc", "function": {"name": "f", "arguments": {}}}],
        },
        "done": True,
    }
    _, adapter = harness.pair("ollama", Reply(body=body))
    assert adapter.complete(request()).tool_calls == [RawToolCall(id="abc", name="f", arguments={})]


def test_error_line_mid_stream(harness: Harness) -> None:
    _, adapter = harness.pair("ollama", Reply(text="some words here", fault=Fault.ERROR_EVENT))
    with pytest.raises(ModelTransport, match="unexpected EOF"):
        drain(adapter.stream(request()))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "http://127.0.0.1:11434"),
        ("", "http://127.0.0.1:11434"),
        ("0.0.0.0", "http://0.0.0.0:11434"),
        ("gpu-box:8080", "http://gpu-box:8080"),
        ("gpu-box", "http://gpu-box:11434"),
        ("http://gpu-box", "http://gpu-box:80"),
        ("https://ollama.example.com", "https://ollama.example.com:443"),
        ("https://ollama.example.com:8443/prefix/", "https://ollama.example.com:8443/prefix"),
        ("[::1]:9999", "http://[::1]:9999"),
        ("[::1]", "http://[::1]:11434"),
        ("::1", "http://[::1]:11434"),
        (":7000", "http://127.0.0.1:7000"),
    ],
)
def test_parse_host(value: str | None, expected: str) -> None:
    assert parse_host(value) == expected


@pytest.mark.parametrize("value", ["ftp://host", "host:notaport", "host:70000"])
def test_parse_host_rejects(value: str) -> None:
    with pytest.raises(ConfigError, match="OLLAMA_HOST"):
        parse_host(value)


def test_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_HOST", "10.0.0.5:11500")
    with OllamaAdapter.from_env("llama3:8b") as adapter:
        assert adapter.host == "http://10.0.0.5:11500"
        assert adapter.model == "llama3:8b"
        assert repr(adapter) == "OllamaAdapter(model='llama3:8b', host='http://10.0.0.5:11500')"
