"""The shared transport: stream framing, Retry-After, backoff, bounds and error translation."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from email.utils import formatdate

import pytest

from shared.errors import ConfigError, ModelTransport
from shared.llm.framing import LineSplitter, NdjsonParser, SseEvent, SseParser
from shared.llm.retry import Retrier, RetryableStatus, backoff_delay, is_retryable_status, parse_retry_after
from shared.llm.settings import HttpSettings
from shared.llm.transport import HttpTransport, Redactor, SecretHeaderAuth, error_detail
from tests.fakeproviders import Reply
from tests.unit.llm.support import API_KEY, FAST, Harness

SSE_STREAM = (
    "event: message_start\n"
    'data: {"type": "message_start", "text": "Grüße 🌍"}\n'
    "\n"
    ": a comment line\n"
    "data: first line\n"
    "data: second line\n"
    "id: 7\n"
    "\n"
    "event: message_stop\r\n"
    'data: {"type": "message_stop"}\r\n'
    "\r\n"
).encode()

SSE_EVENTS = [
    SseEvent(event="message_start", data='{"type": "message_start", "text": "Grüße 🌍"}'),
    SseEvent(event="message", data="first line\nsecond line", id="7"),
    SseEvent(event="message_stop", data='{"type": "message_stop"}', id="7"),
]


def feed_sse(chunks: list[bytes]) -> list[SseEvent]:
    parser = SseParser()
    events = [event for chunk in chunks for event in parser.feed(chunk)]
    return events + parser.finish()


def splits(data: bytes) -> list[list[bytes]]:
    """Every way of cutting ``data`` in two, byte by byte, and a few random many-way cuts."""
    cuts = [[data[:i], data[i:]] for i in range(len(data) + 1)]
    cuts.append([bytes([b]) for b in data])
    rng = random.Random(7)
    for _ in range(20):
        pieces, at = [], 0
        while at < len(data):
            size = rng.randint(1, 7)
            pieces.append(data[at : at + size])
            at += size
        cuts.append(pieces)
    return cuts


class TestSse:
    def test_parses_whole_stream(self) -> None:
        assert feed_sse([SSE_STREAM]) == SSE_EVENTS

    def test_same_events_however_the_stream_is_cut(self) -> None:
        # Includes cuts inside "🌍" and "ü" (multi-byte UTF-8) and between "\r" and "\n".
        for chunks in splits(SSE_STREAM):
            assert feed_sse(chunks) == SSE_EVENTS, chunks

    def test_cr_only_line_endings(self) -> None:
        assert feed_sse([b"data: a\r\rdata: b\r\r"]) == [SseEvent(data="a"), SseEvent(data="b")]

    def test_unterminated_last_event_is_dropped(self) -> None:
        # The spec drops an event whose blank line never came: it may be cut short.
        assert feed_sse([b"data: whole\n\ndata: [DONE]"]) == [SseEvent(data="whole")]
        assert feed_sse([b"data: whole\n\ndata: [DONE]\n"]) == [SseEvent(data="whole")]

    def test_bom_and_field_without_value(self) -> None:
        assert feed_sse(["\ufeffdata\n\ndata:x\n\n".encode()]) == [SseEvent(data=""), SseEvent(data="x")]

    def test_blank_lines_without_data_dispatch_nothing(self) -> None:
        assert feed_sse([b"\n\n: keepalive\n\nevent: ping\n\n"]) == []

    def test_invalid_utf8_becomes_replacement_characters(self) -> None:
        # As the SSE spec prescribes (and the providers' SDKs do): bytes that are not UTF-8 cost
        # characters, not the answer. A UTF-8-encoded surrogate (ED A0 BD) is not UTF-8 either.
        events = feed_sse([b"data: \xff\xfe ok \xed\xa0\xbd\n\n"])
        assert events == [SseEvent(data="\ufffd\ufffd ok \ufffd\ufffd\ufffd")]


class TestNdjson:
    LINES = [{"message": {"content": "Grüße 🌍"}, "done": False}, {"done": True, "eval_count": 3}]
    DATA = b"".join(json.dumps(line, ensure_ascii=False).encode() + b"\n" for line in LINES)

    def parse(self, chunks: list[bytes]) -> list[object]:
        parser = NdjsonParser()
        values = [value for chunk in chunks for value in parser.feed(chunk)]
        return values + parser.finish()

    def test_same_values_however_the_stream_is_cut(self) -> None:
        for chunks in splits(self.DATA):
            assert self.parse(chunks) == self.LINES, chunks

    def test_crlf_blank_lines_and_last_line_without_newline(self) -> None:
        assert self.parse([b'{"a": 1}\r\n\r\n{"b": 2}']) == [{"a": 1}, {"b": 2}]

    def test_malformed_line(self) -> None:
        with pytest.raises(ValueError, match="malformed JSON line") as info:
            self.parse([b'{"a": 1}\n{"b": \n'])
        assert getattr(info.value, "truncated", None) is False

    def test_stream_cut_inside_an_object_is_truncation(self) -> None:
        with pytest.raises(ValueError, match="ended inside a JSON line") as info:
            self.parse([b'{"a": 1}\n{"b": '])
        assert getattr(info.value, "truncated", None) is True


def test_line_splitter_keeps_partial_line() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"one\ntw") == ["one"]
    assert splitter.feed(b"o\r") == []  # maybe half of a CRLF
    assert splitter.feed(b"\nthree") == ["two"]
    assert splitter.finish() == ([], "three")


def test_line_splitter_decodes_characters_cut_anywhere_and_a_truncated_one_as_replacement() -> None:
    splitter = LineSplitter()
    data = "Grüße 🌍\r\n".encode()
    assert [line for i in range(len(data)) for line in splitter.feed(data[i : i + 1])] == ["Grüße 🌍"]
    assert splitter.feed("🌍".encode()[:3]) == []  # the stream ends inside a character
    assert splitter.finish() == ([], "\ufffd")


class TestRetryAfter:
    NOW = 1_700_000_000.0

    @pytest.mark.parametrize(
        ("headers", "expected"),
        [
            ({"retry-after": "7"}, 7.0),
            ({"retry-after": " 0 "}, 0.0),
            ({"retry-after": "1.5"}, 1.5),
            ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
            ({"retry-after-ms": "nonsense", "retry-after": "9"}, 9.0),
            ({"retry-after": "-3"}, None),
            ({"retry-after": "nan"}, None),
            ({"retry-after": "inf"}, None),
            ({"retry-after": "soon"}, None),
            ({}, None),
        ],
    )
    def test_values(self, headers: dict[str, str], expected: float | None) -> None:
        assert parse_retry_after(headers, now=self.NOW) == expected

    def test_http_date(self) -> None:
        header = formatdate(self.NOW + 12, usegmt=True)
        assert parse_retry_after({"retry-after": header}, now=self.NOW) == 12.0

    def test_http_date_in_the_past_means_now(self) -> None:
        header = formatdate(self.NOW - 100, usegmt=True)
        assert parse_retry_after({"retry-after": header}, now=self.NOW) == 0.0


class TestRetrier:
    """The retry loop alone: what it sleeps, how often it tries, what it finally raises."""

    SETTINGS = HttpSettings(max_attempts=3, backoff_base_s=0.5, backoff_max_s=8.0, retry_after_cap_s=30.0)

    def run(
        self, *outcomes: Exception | str, settings: HttpSettings = SETTINGS
    ) -> tuple[str, list[float], int]:
        sleeps: list[float] = []
        pending = list(outcomes)
        calls = 0

        def attempt() -> str:
            nonlocal calls
            calls += 1
            outcome = pending.pop(0)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        def restate(error: ModelTransport, rewrite: Callable[[str], str]) -> ModelTransport:
            return ModelTransport(rewrite(error.message), status_code=error.status_code, retryable=True)

        result = Retrier(settings, sleep=sleeps.append, rng=lambda: 1.0).run(attempt, restate)
        return result, sleeps, calls

    @staticmethod
    def status(code: int, retry_after_s: float | None = None) -> RetryableStatus:
        return RetryableStatus(
            ModelTransport(f"HTTP {code}", status_code=code, retryable=True), retry_after_s
        )

    def test_retry_after_replaces_the_backoff(self) -> None:
        assert self.run(self.status(429, 2.5), self.status(503), "ok") == ("ok", [2.5, 1.0], 3)

    def test_backoff_doubles_per_attempt(self) -> None:
        network = ModelTransport("connection failed", retryable=True)
        assert self.run(network, network, "ok") == ("ok", [0.5, 1.0], 3)

    def test_not_retryable_is_raised_at_once(self) -> None:
        with pytest.raises(ModelTransport, match="^HTTP 400$"):
            self.run(ModelTransport("HTTP 400", status_code=400), "never")

    def test_gives_up_after_the_last_attempt(self) -> None:
        with pytest.raises(ModelTransport) as info:
            self.run(self.status(500), self.status(502), self.status(503), "never")
        assert info.value.message == "gave up after 3 attempts: HTTP 503"
        assert (info.value.status_code, info.value.retryable) == (503, True)

    def test_a_retry_after_beyond_the_cap_is_not_waited_for(self) -> None:
        with pytest.raises(ModelTransport) as info:
            self.run(self.status(429, 31.0), "never")
        assert (
            info.value.message
            == "HTTP 429 (server asked to retry after 31s, more than the 30s this client waits)"
        )

    def test_one_attempt_raises_the_error_as_it_is(self) -> None:
        error = ModelTransport("connection failed", retryable=True)
        with pytest.raises(ModelTransport) as info:
            self.run(error, settings=HttpSettings(max_attempts=1))
        assert info.value is error


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (408, True),
        (429, True),
        (500, True),
        (503, True),
        (400, False),
        (401, False),
        (404, False),
        (422, False),
    ],
)
def test_retryable_statuses(status: int, retryable: bool) -> None:
    assert is_retryable_status(status) is retryable


def test_backoff_is_full_jitter_and_bounded() -> None:
    settings = HttpSettings(backoff_base_s=1.0, backoff_max_s=5.0)
    assert [backoff_delay(n, settings, rng=lambda: 1.0) for n in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert backoff_delay(3, settings, rng=lambda: 0.0) == 0.0
    assert 0.0 <= backoff_delay(2, settings) <= 2.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"connect_timeout_s": 0},
        {"backoff_base_s": -1},
        {"retry_after_cap_s": -1},
        {"max_body_bytes": 0},
    ],
)
def test_settings_reject_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        HttpSettings(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            '{"error": {"message": "bad role", "type": "invalid_request_error"}}',
            "invalid_request_error: bad role",
        ),
        (
            '{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}',
            "overloaded_error: Overloaded",
        ),
        ('{"error": "model not found"}', "model not found"),
        ("<html>Bad Gateway</html>", "<html>Bad Gateway</html>"),
        ('["odd"]', '["odd"]'),
    ],
)
def test_error_detail(body: str, expected: str) -> None:
    assert error_detail(body) == expected


def test_redactor_and_auth_reprs_hide_secrets() -> None:
    redact = Redactor([API_KEY, "abc"])  # too short to redact safely: left alone
    assert redact(f"key {API_KEY} and abc") == "key [redacted] and abc"
    assert API_KEY not in repr(redact)
    assert API_KEY not in repr(SecretHeaderAuth({"x-api-key": API_KEY}))


class TestTransport:
    def transport(self, settings: HttpSettings = FAST, sleeps: list[float] | None = None) -> HttpTransport:
        record: Callable[[float], None] = sleeps.append if sleeps is not None else (lambda _: None)
        return HttpTransport("fake", settings, secrets=[API_KEY], sleep=record)

    def test_connection_refused_is_retryable_and_retried(self, free_port: Callable[[], int]) -> None:
        sleeps: list[float] = []
        with self.transport(sleeps=sleeps) as transport, pytest.raises(ModelTransport) as info:
            transport.post_json(f"http://127.0.0.1:{free_port()}/x", {}, timeout_s=2)
        assert info.value.retryable is True
        assert info.value.status_code is None
        assert "gave up after 3 attempts" in info.value.message
        assert "connection failed" in info.value.message
        assert len(sleeps) == 2  # between the three attempts
        assert all(0 <= s <= FAST.backoff_max_s for s in sleeps)

    def test_error_is_not_chained_to_the_httpx_exception(self, free_port: Callable[[], int]) -> None:
        settings = HttpSettings(max_attempts=1)
        with self.transport(settings) as transport, pytest.raises(ModelTransport) as info:
            transport.post_json(f"http://127.0.0.1:{free_port()}/x", {}, timeout_s=2)
        assert info.value.__cause__ is None
        assert info.value.__suppress_context__ is True
        assert "gave up" not in info.value.message  # one attempt: nothing was retried

    def test_body_over_the_limit_is_refused(self, harness: Harness) -> None:
        fake = harness.fake("ollama", Reply(text="x" * 5000))
        settings = HttpSettings(max_body_bytes=1000)
        with self.transport(settings) as transport, pytest.raises(ModelTransport) as info:
            transport.post_json(fake.url + "/api/chat", {"stream": False}, timeout_s=2)
        assert "exceeds 1000 bytes" in info.value.message
        assert info.value.retryable is False
        assert len(fake.requests) == 1

    def test_stream_over_the_limit_is_refused(self, harness: Harness) -> None:
        fake = harness.fake("ollama", Reply(text="x" * 5000))
        settings = HttpSettings(max_body_bytes=1000)
        with self.transport(settings) as transport, pytest.raises(ModelTransport, match="exceeds 1000 bytes"):
            with transport.stream_ndjson(fake.url + "/api/chat", {"stream": True}, timeout_s=2) as lines:
                list(lines)

    def test_invalid_url_is_a_transport_error(self) -> None:
        with self.transport() as transport, pytest.raises(ModelTransport) as info:
            transport.post_json("ftp://example.invalid/x", {}, timeout_s=1)
        assert info.value.retryable is False

    def test_url_in_errors_drops_userinfo_and_query(self, free_port: Callable[[], int]) -> None:
        settings = HttpSettings(max_attempts=1)
        url = f"http://user:{API_KEY}@127.0.0.1:{free_port()}/v1/x?key={API_KEY}"
        with self.transport(settings) as transport, pytest.raises(ModelTransport) as info:
            transport.post_json(url, {}, timeout_s=1)
        assert API_KEY not in str(info.value)
        assert "/v1/x" in info.value.message
