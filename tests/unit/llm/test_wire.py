"""Every adapter over ``httpx.MockTransport``: tool round trips, error statuses, Retry-After, read
timeouts, and text that arrives cut inside its characters (UTF-8 bytes between chunks, UTF-16
halves between events) or that is not well-formed at all."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.errors import ModelTransport
from shared.llm.base import ModelRequest, ModelResponse, RawToolCall, TextDelta
from shared.llm.settings import HttpSettings
from shared.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from tests.fakeproviders import PROVIDERS, FakeToolCall, Fault, Reply, Split
from tests.unit.llm.support import (
    WEATHER,
    Adapter,
    MockProvider,
    drain,
    every_byte,
    request,
    whole,
)

providers = pytest.mark.parametrize("provider", PROVIDERS)
modes = pytest.mark.parametrize("mode", ["complete", "stream"])

#: Two-, three- and four-byte UTF-8 characters; the emoji are outside the BMP (two UTF-16 units).
TEXT = "Grüße aus 東京 🌍😀, 12°C 🌧."
CITY = "Zürich 🌍"
CALL_IDS = {"openai": "call_Ab12", "anthropic": "toolu_01A", "ollama": None}
PATHS = {"openai": "/chat/completions", "anthropic": "/v1/messages", "ollama": "/api/chat"}


def call(adapter: Adapter, mode: str, req: ModelRequest | None = None) -> ModelResponse:
    req = req or request()
    if mode == "complete":
        return adapter.complete(req)
    deltas, final = drain(adapter.stream(req))
    assert "".join(deltas) == (final.text or "")
    return final


def stream_parts(adapter: Adapter, req: ModelRequest | None = None) -> tuple[list[str], ModelResponse]:
    """The stream's deltas and final answer, checking every part can be serialised."""
    parts = list(adapter.stream(req or request()))
    for part in parts:
        part.model_dump_json()  # raises on a lone surrogate
    deltas, final = drain(parts)
    return deltas, final


def city_arguments(provider: str, mode: str) -> Any:
    """The raw arguments of a ``get_weather(city=CITY)`` call as each provider passes them on."""
    text = json.dumps({"city": CITY}, ensure_ascii=False)
    if provider == "openai" or (provider == "anthropic" and mode == "stream"):
        return text  # JSON text
    return {"city": CITY}  # an object


def tool_result_message(provider: str, call_id: str) -> dict[str, Any]:
    if provider == "openai":
        return {"role": "tool", "tool_call_id": call_id, "content": "12°C, rain"}
    if provider == "anthropic":
        result = {"type": "tool_result", "tool_use_id": call_id, "content": "12°C, rain", "is_error": False}
        return {"role": "user", "content": [result]}
    return {"role": "tool", "content": "12°C, rain", "tool_name": "get_weather"}


# --- The API over a mocked network ------------------------------------------------------------


@providers
@modes
def test_tool_round_trip(provider: str, mode: str) -> None:
    mock = MockProvider(
        provider,
        Reply(tool_calls=[FakeToolCall("get_weather", {"city": CITY}, id=CALL_IDS[provider])]),
        Reply(text=TEXT),
    )
    call_id = CALL_IDS[provider] or "call_0"  # Ollama sends no ids: the adapter numbers calls
    question = UserMessage(content="Weather in Zürich?")
    with mock.adapter() as adapter:
        first = call(adapter, mode, request(question, tools=[WEATHER]))
        assert first.tool_calls == [
            RawToolCall(id=call_id, name="get_weather", arguments=city_arguments(provider, mode))
        ]
        made = ToolCall(id=call_id, name="get_weather", arguments={"city": CITY})
        result = ToolMessage(tool_call_id=call_id, name="get_weather", content="12°C, rain")
        followup = request(question, AssistantMessage(tool_calls=[made]), result, tools=[WEATHER])
        assert call(adapter, mode, followup).text == TEXT
    first_sent, second_sent = mock.seen
    assert first_sent.request.url.path == second_sent.request.url.path == PATHS[provider]
    assert first_sent.body.get("stream", False) is (mode == "stream")
    assert second_sent.body["messages"][-1] == tool_result_message(provider, call_id)


@providers
@modes
def test_error_status_is_not_retried(provider: str, mode: str) -> None:
    mock = MockProvider(provider, Reply(fault=Fault.BAD_REQUEST), Reply(text="never asked for"))
    with mock.adapter() as adapter, pytest.raises(ModelTransport) as info:
        call(adapter, mode)
    error = info.value
    assert (error.status_code, error.retryable) == (400, False)
    assert error.message.startswith(f"{provider}: HTTP 400 from POST http://provider.test")
    assert error.message.endswith(mock.renderer.status_error(Fault.BAD_REQUEST, None)[1])
    assert len(mock.seen) == 1


@providers
@modes
def test_429_waits_as_retry_after_says_then_succeeds(provider: str, mode: str) -> None:
    mock = MockProvider(provider, Reply(fault=Fault.RATE_LIMIT, retry_after_ms="200"), Reply(text=TEXT))
    with mock.adapter() as adapter:
        assert call(adapter, mode).text == TEXT
    first, second = mock.seen
    assert second.at - first.at >= 0.2  # FAST's own backoff is at most 0.02 s
    assert first.body == second.body


@providers
def test_429_retry_after_beyond_the_cap_fails_at_once(provider: str) -> None:
    mock = MockProvider(provider, Reply(fault=Fault.RATE_LIMIT, retry_after="3600"), Reply(text=TEXT))
    with mock.adapter() as adapter, pytest.raises(ModelTransport) as info:
        call(adapter, "complete")
    assert (info.value.status_code, info.value.retryable) == (429, True)
    assert info.value.message.endswith(
        "(server asked to retry after 3600s, more than the 5s this client waits)"
    )
    assert len(mock.seen) == 1


@providers
@modes
def test_read_timeout_comes_from_the_settings_unless_the_request_sets_one(provider: str, mode: str) -> None:
    mock = MockProvider(provider, Reply(text="a"), Reply(text="b"))
    settings = HttpSettings(connect_timeout_s=3.0, read_timeout_s=42.0)
    with mock.adapter(settings) as adapter:
        call(adapter, mode)
        call(adapter, mode, request(timeout_s=1.5))
    timeouts = [seen.request.extensions["timeout"] for seen in mock.seen]
    assert [(t["connect"], t["read"]) for t in timeouts] == [(3.0, 42.0), (1.5, 1.5)]


# --- Characters cut between chunks and events -------------------------------------------------


@providers
@modes
def test_characters_cut_between_byte_chunks_arrive_whole(provider: str, mode: str) -> None:
    reply = Reply(text=TEXT, tool_calls=[FakeToolCall("get_weather", {"city": CITY}, id=CALL_IDS[provider])])
    with MockProvider(provider, reply, cut=every_byte).adapter() as adapter:
        response = call(adapter, mode, request(tools=[WEATHER]))
    assert response.text == TEXT
    assert [c.arguments for c in response.tool_calls] == [city_arguments(provider, mode)]


@providers
@pytest.mark.parametrize("cut", [every_byte, whole], ids=["every-byte", "whole"])
def test_utf16_halves_in_separate_events_arrive_whole(provider: str, cut: Any) -> None:
    # A server slicing JavaScript strings sends each emoji as "\ud83c" in one event and "\udf0d"
    # in the next: decoded one event at a time, each is a lone surrogate.
    calls = [FakeToolCall("get_weather", {"city": CITY}, id=CALL_IDS[provider])]
    reply = Reply(text=TEXT, tool_calls=calls, split_characters=Split.UTF16)
    mock = MockProvider(provider, reply, cut=cut)
    with mock.adapter() as adapter:
        deltas, final = stream_parts(adapter, request(tools=[WEATHER]))
    assert b"\\ud83c" in mock.renderer.answer(reply, {"stream": True}, 1)  # the halves really travel apart
    assert "".join(deltas) == final.text == TEXT
    assert [c.arguments for c in final.tool_calls] == [city_arguments(provider, "stream")]
    assert final.raw is not None and "🌍" in final.raw


@providers
def test_a_half_character_at_the_end_of_the_text_becomes_a_replacement_character(provider: str) -> None:
    # The text's last piece is a first half whose partner never comes.
    reply = Reply(text="ok 🌍", split_characters=Split.UTF16)
    mock = MockProvider(provider, reply, cut=corrupt(b"\\udf0d", b""))  # the second half is lost
    with mock.adapter() as adapter:
        deltas, final = stream_parts(adapter)
    assert "".join(deltas) == final.text == "ok \ufffd"


# --- Text that is not well-formed -------------------------------------------------------------


def corrupt(marker: bytes, replacement: bytes) -> Any:
    return lambda data: every_byte(data.replace(marker, replacement))


@providers
@modes
def test_bytes_that_are_not_utf8_become_replacement_characters(provider: str, mode: str) -> None:
    # Markers stay inside one stream piece of the fakes (4 characters).
    mock = MockProvider(provider, Reply(text="XY ok done"), cut=corrupt(b"XY", b"\xff\xed\xa0\xbd"))
    with mock.adapter() as adapter:
        response = call(adapter, mode)
    assert response.text == "\ufffd\ufffd\ufffd\ufffd ok done"  # ED A0 BD: a surrogate, not UTF-8
    response.model_dump_json()


@providers
@modes
def test_lone_surrogate_escapes_become_replacement_characters(provider: str, mode: str) -> None:
    # A hostile (or broken) provider's JSON: a low half alone, a high half followed by a letter.
    # Markers stay inside one stream piece of the fakes (4 characters).
    cut = corrupt(b"XY", b"\\udc00")
    mock = MockProvider(
        provider, Reply(text="XY aZW b c"), cut=lambda data: cut(data.replace(b"ZW", b"\\ud83dZ"))
    )
    with mock.adapter() as adapter:
        response = call(adapter, mode)
    assert response.text == "\ufffd a\ufffdZ b c"
    response.model_dump_json()


@pytest.mark.parametrize("mode", ["complete", "stream"])
def test_lone_surrogate_escapes_in_tool_arguments_become_replacement_characters(mode: str) -> None:
    # The arguments are JSON text the runtime decodes later: an escaped lone half in them would
    # become a lone surrogate there, so the adapter's output carries \ufffd instead.
    calls = [FakeToolCall("get_weather", {"XY": "ok"}, id="call_1")]  # in the stream's first piece
    mock = MockProvider("openai", Reply(tool_calls=calls), cut=corrupt(b"XY", b"\\\\ud83d"))
    with mock.adapter() as adapter:
        response = call(adapter, mode, request(tools=[WEATHER]))
    (raw,) = response.tool_calls
    assert raw.arguments == '{"\\ufffd": "ok"}'
    assert isinstance(raw.arguments, str) and json.loads(raw.arguments) == {"\ufffd": "ok"}


def test_objects_holding_lone_surrogates_are_cleaned() -> None:
    body = {
        "message": {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "f", "arguments": {"XY": ["XY", 1]}}}],
        },
        "done": True,
    }
    mock = MockProvider("ollama", Reply(body=body), cut=corrupt(b"XY", b"\\udc00"))
    with mock.adapter() as adapter:
        response = adapter.complete(request())
    assert response.tool_calls == [RawToolCall(id="call_0", name="f", arguments={"\ufffd": ["\ufffd", 1]})]


def test_the_contract_types_never_hold_a_lone_surrogate() -> None:
    # Whatever an adapter does, what it returns is well-formed.
    assert TextDelta(text="a\ud83d").text == "a\ufffd"
    response = ModelResponse(text="\udc00", raw="\ud800x", finish_reason="\udfff")
    assert (response.text, response.raw, response.finish_reason) == ("\ufffd", "\ufffdx", "\ufffd")
    call = RawToolCall(id="\ud800", name="n\udc00", arguments='{"a": "\\ud83d\\ude00 \\\\ud800 \\udc00"}')
    # A well-formed pair of escapes stays; an escaped backslash before "ud800" is no escape.
    assert (call.id, call.name) == ("\ufffd", "n\ufffd")
    assert call.arguments == '{"a": "\\ud83d\\ude00 \\\\ud800 \\ufffd"}'
    assert ModelResponse(tool_calls=[call]).model_dump_json()
