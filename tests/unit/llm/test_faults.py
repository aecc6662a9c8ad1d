"""Every injected fault, for every provider, whole answers and streams: what is retried, what is
not, and that each failure is a ModelTransport saying whether a later attempt could succeed."""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable

import pytest

from shared.errors import ModelTransport
from shared.llm.base import ModelResponse, TextDelta
from shared.llm.settings import HttpSettings
from tests.fakeproviders import PROVIDERS, FakeToolCall, Fault, Reply, Split
from tests.unit.llm.support import API_KEY, Adapter, Harness, adapter_at, drain, request

OK = "All good: ünïcode 🌍 intact."
TERMINATORS = {"openai": "[DONE]", "anthropic": "message_stop", "ollama": "done: true"}

providers = pytest.mark.parametrize("provider", PROVIDERS)
modes = pytest.mark.parametrize("mode", ["complete", "stream"])


def call(adapter: Adapter, mode: str, timeout_s: float = 5.0) -> ModelResponse:
    if mode == "complete":
        return adapter.complete(request(timeout_s=timeout_s))
    deltas, final = drain(adapter.stream(request(timeout_s=timeout_s)))
    assert "".join(deltas) == (final.text or "")
    return final


def fails(adapter: Adapter, mode: str, timeout_s: float = 5.0) -> ModelTransport:
    with pytest.raises(ModelTransport) as info:
        call(adapter, mode, timeout_s)
    return info.value


@providers
@modes
def test_429_retry_after_is_honoured_then_success(harness: Harness, provider: str, mode: str) -> None:
    fake, adapter = harness.pair(
        provider, Reply(fault=Fault.RATE_LIMIT, retry_after_ms="300"), Reply(text=OK)
    )
    assert call(adapter, mode).text == OK
    first, second = fake.requests
    assert second.at - first.at >= 0.3  # the jittered backoff alone would be under 0.02 s
    assert first.body == second.body


def test_429_retry_after_in_seconds(harness: Harness) -> None:
    fake, adapter = harness.pair("openai", Reply(fault=Fault.RATE_LIMIT, retry_after="1"), Reply(text=OK))
    assert call(adapter, "complete").text == OK
    first, second = fake.requests
    assert second.at - first.at >= 1.0


@providers
def test_429_retry_after_beyond_the_cap_fails_at_once(harness: Harness, provider: str) -> None:
    fake, adapter = harness.pair(provider, Reply(fault=Fault.RATE_LIMIT, retry_after="3600"), Reply(text=OK))
    error = fails(adapter, "complete")
    assert error.retryable is True  # the run's own retry policy may come back later
    assert error.status_code == 429
    assert "retry after 3600s" in error.message
    assert len(fake.requests) == 1


@providers
@modes
def test_5xx_is_retried_then_success(harness: Harness, provider: str, mode: str) -> None:
    fake, adapter = harness.pair(
        provider, Reply(fault=Fault.SERVER_ERROR), Reply(fault=Fault.UNAVAILABLE), Reply(text=OK)
    )
    assert call(adapter, mode).text == OK
    assert len(fake.requests) == 3


@providers
@modes
def test_5xx_exhausted_is_retryable(harness: Harness, provider: str, mode: str) -> None:
    fake, adapter = harness.pair(provider, *[Reply(fault=Fault.UNAVAILABLE)] * 3, Reply(text=OK))
    error = fails(adapter, mode)
    assert error.retryable is True
    assert error.status_code == 503
    assert error.message.startswith(f"{provider}: gave up after 3 attempts: HTTP 503")
    assert len(fake.requests) == 3
    assert error.info().kind == "ModelTransport"
    assert error.info().details["status_code"] == 503


@providers
@modes
def test_400_is_never_retried(harness: Harness, provider: str, mode: str) -> None:
    fake, adapter = harness.pair(provider, Reply(fault=Fault.BAD_REQUEST), Reply(text=OK))
    error = fails(adapter, mode)
    assert error.retryable is False
    assert error.status_code == 400
    message = fake.renderer.status_error(Fault.BAD_REQUEST, None)[1]
    assert message in error.message  # the provider's own explanation
    assert len(fake.requests) == 1


@providers
@modes
def test_connection_refused(harness: Harness, provider: str, mode: str, free_port: Callable[[], int]) -> None:
    dead = harness.track(adapter_at(provider, f"http://127.0.0.1:{free_port()}"))
    error = fails(dead, mode)
    assert error.retryable is True
    assert error.status_code is None
    assert "connection failed" in error.message
    assert "gave up after 3 attempts" in error.message


@providers
@modes
def test_read_timeout_is_retryable(harness: Harness, provider: str, mode: str) -> None:
    fake, adapter = harness.pair(provider, Reply(fault=Fault.STALL), settings=HttpSettings(max_attempts=1))
    error = fails(adapter, mode, timeout_s=0.3)
    assert error.retryable is True
    assert "read timeout" in error.message
    assert len(fake.requests) == 1


@providers
@modes
def test_stall_before_any_byte_is_retried(harness: Harness, provider: str, mode: str) -> None:
    fake, adapter = harness.pair(provider, Reply(fault=Fault.STALL), Reply(text=OK))
    assert call(adapter, mode, timeout_s=0.3).text == OK
    assert len(fake.requests) == 2


@providers
def test_stall_mid_stream_is_not_retried(harness: Harness, provider: str) -> None:
    fake, adapter = harness.pair(provider, Reply(text=OK * 3, fault=Fault.STALL_MID_STREAM), Reply(text=OK))
    error = fails(adapter, "stream", timeout_s=0.3)
    assert error.retryable is True
    assert "read timeout" in error.message
    assert len(fake.requests) == 1  # part of the answer was consumed: only the caller may retry


@providers
def test_connection_dropped_mid_body_is_retried_for_a_whole_answer(harness: Harness, provider: str) -> None:
    fake, adapter = harness.pair(provider, Reply(text=OK, fault=Fault.DROP), Reply(text=OK))
    assert call(adapter, "complete").text == OK
    assert len(fake.requests) == 2


@providers
def test_connection_dropped_mid_stream_is_an_error_not_a_partial_answer(
    harness: Harness, provider: str
) -> None:
    fake, adapter = harness.pair(provider, Reply(text=OK * 3, fault=Fault.DROP), Reply(text=OK))
    error = fails(adapter, "stream")
    assert error.retryable is True
    assert "connection broken" in error.message
    assert len(fake.requests) == 1


@providers
@modes
def test_disconnect_before_any_byte_is_retried(harness: Harness, provider: str, mode: str) -> None:
    fake, adapter = harness.pair(provider, Reply(fault=Fault.DISCONNECT), Reply(text=OK))
    assert call(adapter, mode).text == OK
    assert len(fake.requests) == 2


@providers
def test_malformed_body(harness: Harness, provider: str) -> None:
    fake, adapter = harness.pair(provider, Reply(fault=Fault.MALFORMED_BODY), Reply(text=OK))
    error = fails(adapter, "complete")
    assert error.retryable is False
    assert "malformed response body" in error.message
    assert error.info().details["body"].startswith('{"id": "broken"')
    assert len(fake.requests) == 1


@providers
def test_malformed_stream_chunk(harness: Harness, provider: str) -> None:
    fake, adapter = harness.pair(provider, Reply(text=OK * 3, fault=Fault.MALFORMED_CHUNK), Reply(text=OK))
    error = fails(adapter, "stream")
    assert error.retryable is False
    assert "malformed" in error.message
    assert len(fake.requests) == 1


@providers
def test_stream_without_terminator_is_an_error(harness: Harness, provider: str) -> None:
    fake, adapter = harness.pair(provider, Reply(text=OK, fault=Fault.NO_TERMINATOR), Reply(text=OK))
    error = fails(adapter, "stream")
    assert error.retryable is True
    assert TERMINATORS[provider] in error.message
    assert len(fake.requests) == 1


@providers
def test_stream_without_terminator_yields_no_final_response(harness: Harness, provider: str) -> None:
    _, adapter = harness.pair(provider, Reply(text=OK, fault=Fault.NO_TERMINATOR))
    parts = []
    with pytest.raises(ModelTransport):
        for part in adapter.stream(request()):
            parts.append(part)
    assert not any(isinstance(p, ModelResponse) for p in parts)


@pytest.mark.parametrize(
    ("provider", "retryable"), [("openai", True), ("anthropic", True), ("ollama", False)]
)
def test_in_band_stream_error(harness: Harness, provider: str, retryable: bool) -> None:
    fake, adapter = harness.pair(provider, Reply(text=OK * 3, fault=Fault.ERROR_EVENT), Reply(text=OK))
    error = fails(adapter, "stream")
    assert "provider reported an error" in error.message
    assert error.retryable is retryable  # server-side kinds only
    assert len(fake.requests) == 1


# --- characters cut on the wire ------------------------------------------------------------------

UNICODE = "Grüße aus 東京 🌍😀, 12°C 🌧."


@providers
@modes
@pytest.mark.parametrize("split", list(Split))
def test_characters_cut_anywhere_arrive_whole(
    harness: Harness, provider: str, mode: str, split: Split
) -> None:
    calls = [FakeToolCall("get_weather", {"city": "Zürich 🌍"})]
    _, adapter = harness.pair(provider, Reply(text=UNICODE, tool_calls=calls, split_characters=split))
    if mode == "complete":
        parts: list[ModelResponse | TextDelta] = [adapter.complete(request())]
    else:
        parts = list(adapter.stream(request()))
    for part in parts:
        part.model_dump_json()  # every delta can be written as an event
    deltas, final = drain(parts)
    assert final.text == UNICODE
    assert "".join(deltas) == (UNICODE if mode == "stream" else "")
    (made,) = final.tool_calls
    arguments = json.loads(made.arguments) if isinstance(made.arguments, str) else made.arguments
    assert arguments == {"city": "Zürich 🌍"}


# --- secrets ----------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@modes
def test_echoed_key_never_reaches_the_error(harness: Harness, provider: str, mode: str) -> None:
    fake, adapter = harness.pair(provider, Reply(fault=Fault.UNAUTHORIZED))
    error = fails(adapter, mode)
    assert error.status_code == 401
    assert error.retryable is False
    assert "[redacted]" in error.message
    shown = [
        str(error),
        repr(error),
        error.message,
        error.info().model_dump_json(),
        "".join(traceback.format_exception(error)),
        repr(adapter),
        str(adapter.__dict__),
    ]
    for text in shown:
        assert API_KEY not in text
    # The fake really did get (and echo) the key.
    assert API_KEY in str(fake.requests[0].headers)


@providers
@modes
def test_key_absent_from_responses_and_network_errors(
    harness: Harness, provider: str, mode: str, free_port: Callable[[], int]
) -> None:
    _, adapter = harness.pair(provider, Reply(text=OK, tool_calls=[FakeToolCall("f", {"a": 1})]))
    response = call(adapter, mode)
    assert response.tool_calls
    assert API_KEY not in response.model_dump_json() + repr(response)
    dead = harness.track(
        adapter_at(provider, f"http://127.0.0.1:{free_port()}", HttpSettings(max_attempts=1))
    )
    refused = fails(dead, mode)
    assert API_KEY not in "".join(traceback.format_exception(refused)) + repr(refused) + repr(dead)
