"""Loopback fake model providers: OpenAI, Anthropic and Ollama as their APIs document them.

A :class:`FakeProvider` is a threaded HTTP server on 127.0.0.1 that answers each request with the
next scripted :class:`Reply` (a text answer or tool calls, optionally a :class:`Fault`) and
records every request it received, headers and JSON body, so tests can assert the exact wire
format. Streams are sent in awkward 1-7 byte HTTP chunks, flushed one by one, so events, JSON
objects and multi-byte characters arrive split at arbitrary points, as real networks do. A reply
can also cut every one of its characters on purpose (:class:`Split`).

In process::

    with FakeProvider("openai", [Reply(text="hi"), Reply(fault=Fault.SERVER_ERROR)]) as fake:
        adapter = OpenAIAdapter("gpt-4o", api_key="sk-test", base_url=fake.base_url)

As a subprocess (prints the base URL for the provider's environment variable on its first line)::

    python -m tests.fakeproviders --provider openai --port 0 --script replies.json

where the script is ``{"replies": [{"text": "hi"}, {"fault": "rate_limit", "retry_after": "1"},
{"tool_calls": [{"name": "add", "arguments": {"a": 1}}]}], "default": {"text": "ok"}}`` (or just
the list of replies). Control endpoints: ``GET /_fake/requests`` (what was received),
``POST /_fake/replies`` (append replies), ``GET /_fake/health``.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from types import FrameType, TracebackType
from typing import Any, ClassVar

CREATED = 1_735_689_600  # a fixed timestamp keeps recorded answers reproducible


class Fault(StrEnum):
    RATE_LIMIT = "rate_limit"  # 429 with Retry-After (Reply.retry_after / retry_after_ms)
    SERVER_ERROR = "server_error"  # 500
    UNAVAILABLE = "unavailable"  # 503, Retry-After if the reply sets one
    BAD_REQUEST = "bad_request"  # 400
    UNAUTHORIZED = "unauthorized"  # 401 whose message echoes the key it got, as some APIs do
    DISCONNECT = "disconnect"  # the connection closes before any response byte
    DROP = "drop"  # the connection closes mid-body (after the status line and some bytes)
    STALL = "stall"  # nothing is sent until the client gives up
    STALL_MID_STREAM = "stall_mid_stream"  # half the stream, then nothing
    MALFORMED_BODY = "malformed_body"  # 200 with a body that is not JSON (a stream: a bad event)
    MALFORMED_CHUNK = "malformed_chunk"  # a stream with one event that is not JSON
    NO_TERMINATOR = "no_terminator"  # a stream that ends cleanly without its terminator
    ERROR_EVENT = "error_event"  # a stream that breaks off with the provider's in-band error


class Split(StrEnum):
    """How a reply cuts its multi-byte characters on purpose (``Reply.split_characters``)."""

    #: Every multi-byte UTF-8 character of a stream is cut between two HTTP chunks.
    BYTES = "bytes"
    #: The JSON is written ASCII-only (non-ASCII as ``\\uXXXX`` escapes) and text and argument
    #: pieces are cut between UTF-16 code units, every character outside the BMP (an emoji) in
    #: the middle: its two surrogate halves arrive in separate events, as a server slicing
    #: JavaScript strings sends them.
    UTF16 = "utf16"


STATUS_FAULTS = {
    Fault.RATE_LIMIT: 429,
    Fault.SERVER_ERROR: 500,
    Fault.UNAVAILABLE: 503,
    Fault.BAD_REQUEST: 400,
    Fault.UNAUTHORIZED: 401,
}
STREAM_ONLY_FAULTS = {Fault.MALFORMED_CHUNK, Fault.NO_TERMINATOR, Fault.STALL_MID_STREAM, Fault.ERROR_EVENT}


@dataclass
class FakeToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass
class Reply:
    """One scripted answer. ``fault`` replaces (or, for stream faults, damages) the answer."""

    text: str | None = None
    tool_calls: list[FakeToolCall] = field(default_factory=list)
    fault: Fault | None = None
    retry_after: str | None = None
    retry_after_ms: str | None = None
    input_tokens: int = 12
    output_tokens: int = 7
    #: Sent verbatim as a whole (non-stream) answer instead of rendering text and tool calls.
    body: Any = None
    split_characters: Split | None = None
    #: The answer stops at the output token limit: each provider's own reason for that is sent.
    truncated: bool = False

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Reply:
        calls = [FakeToolCall(**call) for call in data.get("tool_calls", [])]
        fault = Fault(data["fault"]) if data.get("fault") else None
        split = Split(data["split_characters"]) if data.get("split_characters") else None
        rest = {k: v for k, v in data.items() if k not in ("tool_calls", "fault", "split_characters")}
        return cls(tool_calls=calls, fault=fault, split_characters=split, **rest)

    @property
    def utf16(self) -> bool:
        return self.split_characters is Split.UTF16


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any  # the parsed JSON body, None if it was not JSON
    at: float  # time.monotonic() on arrival

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "path": self.path,
            "headers": self.headers,
            "body": self.body,
            "at": self.at,
        }


def _pieces(text: str, size: int, utf16: bool = False) -> list[str]:
    """``text`` in pieces of ``size`` characters, or (``utf16``) of ``size`` UTF-16 code units
    with a cut after the first half of every surrogate pair (such pieces hold lone surrogates)."""
    if not utf16:
        return [text[i : i + size] for i in range(0, len(text), size)]
    units = text.encode("utf-16-le", "surrogatepass")
    pieces: list[str] = []
    current = bytearray()
    for at in range(0, len(units), 2):
        unit = units[at : at + 2]
        current += unit
        if len(current) >= 2 * size or 0xD800 <= int.from_bytes(unit, "little") <= 0xDBFF:
            pieces.append(current.decode("utf-16-le", "surrogatepass"))
            current.clear()
    if current:
        pieces.append(current.decode("utf-16-le", "surrogatepass"))
    return pieces


def _dumps(value: Any, ascii: bool = False) -> bytes:
    # Raw UTF-8 (no \\u escapes) unless asked, so chunking can split multi-byte characters.
    return json.dumps(value, ensure_ascii=ascii).encode("utf-8")


def _sse(data: Any, event: str | None = None, ascii: bool = False) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + _dumps(data, ascii) + b"\n\n"


def cut_points_inside_characters(payload: bytes) -> list[int]:
    """Offsets that cut every multi-byte UTF-8 character of ``payload`` after its first byte."""
    return [at + 1 for at, byte in enumerate(payload) if byte >= 0xC0]


# --- Wire formats -----------------------------------------------------------------------------


class Renderer:
    """How one provider's API writes answers, errors and streams."""

    name: ClassVar[str]
    route: ClassVar[str]  # the path suffix of the chat endpoint
    base_path: ClassVar[str] = ""  # appended to the server URL to make the SDK-style base URL
    stream_type: ClassVar[str] = "text/event-stream"

    def is_stream(self, body: Any) -> bool:
        return isinstance(body, dict) and body.get("stream") is True

    def env(self, base_url: str, api_key: str) -> dict[str, str]:
        raise NotImplementedError

    def complete(self, reply: Reply, model: str, seq: int) -> Any:
        raise NotImplementedError

    def stream_events(self, reply: Reply, model: str, seq: int, request: Any) -> list[bytes]:
        """The stream's events, each one whole; the last is the terminator."""
        raise NotImplementedError

    def error_body(self, kind: str, message: str) -> Any:
        raise NotImplementedError

    def status_error(self, fault: Fault, key: str | None) -> tuple[str, str]:
        """(error type, message) for a status fault."""
        raise NotImplementedError

    def malformed_event(self) -> bytes:
        raise NotImplementedError

    def error_event(self) -> bytes:
        raise NotImplementedError

    def key(self, headers: dict[str, str]) -> str | None:
        return None

    def answer(self, reply: Reply, request: Any, seq: int) -> bytes:
        """The body of a successful answer to ``request`` as sent: a stream's events one after
        the other, or the whole JSON answer."""
        model = request.get("model", "fake-model") if isinstance(request, dict) else "fake-model"
        if self.is_stream(request):
            return b"".join(self.stream_events(reply, model, seq, request))
        answer = reply.body if reply.body is not None else self.complete(reply, model, seq)
        return _dumps(answer, reply.utf16)

    def status_answer(self, fault: Fault, reply: Reply, key: str | None) -> tuple[int, dict[str, str], bytes]:
        """A status fault's status, headers (the reply's Retry-After) and body."""
        kind, message = self.status_error(fault, key)
        headers = {}
        if reply.retry_after is not None:
            headers["Retry-After"] = reply.retry_after
        if reply.retry_after_ms is not None:
            headers["retry-after-ms"] = reply.retry_after_ms
        return STATUS_FAULTS[fault], headers, _dumps(self.error_body(kind, message))


class OpenAIRenderer(Renderer):
    name = "openai"
    route = "/chat/completions"
    base_path = "/v1"

    def env(self, base_url: str, api_key: str) -> dict[str, str]:
        return {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key}

    def key(self, headers: dict[str, str]) -> str | None:
        return headers.get("authorization", "").removeprefix("Bearer ") or None

    def _calls(self, reply: Reply, seq: int) -> list[dict[str, Any]]:
        return [
            {
                "id": call.id or f"call_fake{seq}x{i}",
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
            }
            for i, call in enumerate(reply.tool_calls)
        ]

    def _usage(self, reply: Reply) -> dict[str, Any]:
        return {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        }

    def complete(self, reply: Reply, model: str, seq: int) -> Any:
        calls = self._calls(reply, seq)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.text,
            "refusal": None,
            "annotations": [],
        }
        if calls:
            message["tool_calls"] = calls
        return {
            "id": f"chatcmpl-fake{seq}",
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "length" if reply.truncated else "tool_calls" if calls else "stop",
                }
            ],
            "usage": self._usage(reply),
            "service_tier": "default",
            "system_fingerprint": "fp_fake",
        }

    def stream_events(self, reply: Reply, model: str, seq: int, request: Any) -> list[bytes]:
        def chunk(delta: dict[str, Any] | None, finish: str | None = None, usage: Any = None) -> bytes:
            choices = (
                []
                if delta is None
                else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
            )
            body = {
                "id": f"chatcmpl-fake{seq}",
                "object": "chat.completion.chunk",
                "created": CREATED,
                "model": model,
                "system_fingerprint": "fp_fake",
                "choices": choices,
            }
            if include_usage:
                body["usage"] = usage
            return b"data: " + _dumps(body, reply.utf16) + b"\n\n"

        include_usage = bool(request.get("stream_options", {}).get("include_usage"))
        events = [chunk({"role": "assistant", "content": "", "refusal": None})]
        events += [chunk({"content": piece}) for piece in _pieces(reply.text or "", 4, reply.utf16)]
        for i, call in enumerate(self._calls(reply, seq)):
            head = {"index": i, "id": call["id"], "type": "function"}
            events.append(
                chunk(
                    {
                        "tool_calls": [
                            {**head, "function": {"name": call["function"]["name"], "arguments": ""}}
                        ]
                    }
                )
            )
            for piece in _pieces(call["function"]["arguments"], 5, reply.utf16):
                events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
        events.append(
            chunk({}, "length" if reply.truncated else "tool_calls" if reply.tool_calls else "stop")
        )
        if include_usage:
            events.append(chunk(None, usage=self._usage(reply)))
        return [*events, b"data: [DONE]\n\n"]

    def error_body(self, kind: str, message: str) -> Any:
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}

    def status_error(self, fault: Fault, key: str | None) -> tuple[str, str]:
        return {
            Fault.RATE_LIMIT: ("requests", "Rate limit reached for requests. Please try again in 1s."),
            Fault.SERVER_ERROR: ("server_error", "The server had an error while processing your request."),
            Fault.UNAVAILABLE: (
                "server_error",
                "The engine is currently overloaded, please try again later.",
            ),
            Fault.BAD_REQUEST: ("invalid_request_error", "Invalid value for 'messages[0].role'."),
            Fault.UNAUTHORIZED: ("invalid_request_error", f"Incorrect API key provided: {key}."),
        }[fault]

    def malformed_event(self) -> bytes:
        return b'data: {"id": "chatcmpl-broken", "choices": [{"index": 0, "delta": {"content": "x"\n\n'

    def error_event(self) -> bytes:
        return _sse(
            {
                "error": {
                    "message": "The server had an error while processing your request.",
                    "type": "server_error",
                }
            }
        )


class AnthropicRenderer(Renderer):
    name = "anthropic"
    route = "/v1/messages"

    def env(self, base_url: str, api_key: str) -> dict[str, str]:
        return {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": api_key}

    def key(self, headers: dict[str, str]) -> str | None:
        return headers.get("x-api-key")

    def _blocks(self, reply: Reply, seq: int) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
        blocks += [
            {
                "type": "tool_use",
                "id": call.id or f"toolu_fake{seq}x{i}",
                "name": call.name,
                "input": call.arguments,
            }
            for i, call in enumerate(reply.tool_calls)
        ]
        return blocks

    def complete(self, reply: Reply, model: str, seq: int) -> Any:
        return {
            "id": f"msg_fake{seq}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": self._blocks(reply, seq),
            "stop_reason": "max_tokens"
            if reply.truncated
            else "tool_use"
            if reply.tool_calls
            else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": reply.input_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": reply.output_tokens,
            },
        }

    def stream_events(self, reply: Reply, model: str, seq: int, request: Any) -> list[bytes]:
        def event(data: dict[str, Any]) -> bytes:
            return _sse(data, data["type"], reply.utf16)

        start = {**self.complete(reply, model, seq), "content": [], "stop_reason": None}
        start["usage"] = {**start["usage"], "output_tokens": 1}
        events = [event({"type": "message_start", "message": start}), event({"type": "ping"})]
        for index, block in enumerate(self._blocks(reply, seq)):
            if block["type"] == "text":
                events.append(
                    event(
                        {
                            "type": "content_block_start",
                            "index": index,
                            "content_block": {"type": "text", "text": ""},
                        }
                    )
                )
                for piece in _pieces(block["text"], 4, reply.utf16):
                    delta = {"type": "text_delta", "text": piece}
                    events.append(event({"type": "content_block_delta", "index": index, "delta": delta}))
            else:
                opened = {**block, "input": {}}
                events.append(event({"type": "content_block_start", "index": index, "content_block": opened}))
                arguments = json.dumps(block["input"], ensure_ascii=False)
                for piece in ["", *_pieces(arguments, 5, reply.utf16)]:
                    delta = {"type": "input_json_delta", "partial_json": piece}
                    events.append(event({"type": "content_block_delta", "index": index, "delta": delta}))
            events.append(event({"type": "content_block_stop", "index": index}))
        stop = "max_tokens" if reply.truncated else "tool_use" if reply.tool_calls else "end_turn"
        events.append(
            event(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": reply.output_tokens},
                }
            )
        )
        return [*events, event({"type": "message_stop"})]

    def error_body(self, kind: str, message: str) -> Any:
        return {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_fake"}

    def status_error(self, fault: Fault, key: str | None) -> tuple[str, str]:
        return {
            Fault.RATE_LIMIT: ("rate_limit_error", "Number of requests has exceeded your rate limit."),
            Fault.SERVER_ERROR: ("api_error", "Internal server error"),
            Fault.UNAVAILABLE: ("overloaded_error", "Overloaded"),
            Fault.BAD_REQUEST: ("invalid_request_error", "messages: roles must alternate"),
            Fault.UNAUTHORIZED: ("authentication_error", f"invalid x-api-key {key}"),
        }[fault]

    def malformed_event(self) -> bytes:
        return b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, "delta": {\n\n'

    def error_event(self) -> bytes:
        return _sse(
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, "error"
        )


class OllamaRenderer(Renderer):
    name = "ollama"
    route = "/api/chat"
    stream_type = "application/x-ndjson"

    def is_stream(self, body: Any) -> bool:
        return isinstance(body, dict) and body.get("stream", True) is not False  # Ollama streams by default

    def env(self, base_url: str, api_key: str) -> dict[str, str]:
        return {"OLLAMA_HOST": base_url}

    def _head(self, model: str) -> dict[str, Any]:
        return {"model": model, "created_at": "2025-01-01T00:00:00.000000Z"}

    def _final(self, reply: Reply, model: str, message: dict[str, Any]) -> dict[str, Any]:
        return {
            **self._head(model),
            "message": message,
            "done_reason": "length" if reply.truncated else "stop",
            "done": True,
            "total_duration": 1_500_000_000,
            "load_duration": 20_000_000,
            "prompt_eval_count": reply.input_tokens,
            "prompt_eval_duration": 300_000_000,
            "eval_count": reply.output_tokens,
            "eval_duration": 1_100_000_000,
        }

    def _calls(self, reply: Reply) -> list[dict[str, Any]]:
        return [{"function": {"name": call.name, "arguments": call.arguments}} for call in reply.tool_calls]

    def complete(self, reply: Reply, model: str, seq: int) -> Any:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or ""}
        if reply.tool_calls:
            message["tool_calls"] = self._calls(reply)
        return self._final(reply, model, message)

    def stream_events(self, reply: Reply, model: str, seq: int, request: Any) -> list[bytes]:
        def line(data: dict[str, Any]) -> bytes:
            return _dumps(data, reply.utf16) + b"\n"

        events = [
            line({**self._head(model), "message": {"role": "assistant", "content": piece}, "done": False})
            for piece in _pieces(reply.text or "", 4, reply.utf16)
        ]
        if reply.tool_calls:
            message = {"role": "assistant", "content": "", "tool_calls": self._calls(reply)}
            events.append(line({**self._head(model), "message": message, "done": False}))
        return [*events, line(self._final(reply, model, {"role": "assistant", "content": ""}))]

    def error_body(self, kind: str, message: str) -> Any:
        return {"error": message}

    def status_error(self, fault: Fault, key: str | None) -> tuple[str, str]:
        return {
            Fault.RATE_LIMIT: ("", "too many requests"),
            Fault.SERVER_ERROR: ("", "an error was encountered while running the model"),
            Fault.UNAVAILABLE: ("", "server busy, please try again.  maximum pending requests exceeded"),
            Fault.BAD_REQUEST: ("", "invalid message format"),
            Fault.UNAUTHORIZED: ("", "unauthorized"),
        }[fault]

    def malformed_event(self) -> bytes:
        return b'{"model": "broken", "message": {"role": "assistant", "content": \n'

    def error_event(self) -> bytes:
        return b'{"error": "an error was encountered while running the model: unexpected EOF"}\n'


RENDERERS: dict[str, type[Renderer]] = {
    r.name: r for r in (OpenAIRenderer, AnthropicRenderer, OllamaRenderer)
}
PROVIDERS = tuple(RENDERERS)


# --- The server -------------------------------------------------------------------------------


class FakeProvider:
    """A scripted fake of one provider's API on a loopback port. Thread-safe."""

    def __init__(
        self,
        provider: str,
        replies: Iterable[Reply] = (),
        *,
        default: Reply | None = None,
        chunk_sizes: tuple[int, int] = (1, 7),
        seed: int = 0,
        stall_s: float = 30.0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.renderer = RENDERERS[provider]()
        self.default = default
        self.chunk_sizes = chunk_sizes
        #: How long a stall lasts at most; stop() ends it at once.
        self.stall_s = stall_s
        self._address = (host, port)
        self._replies: deque[Reply] = deque(replies)
        self._requests: list[RecordedRequest] = []
        self._changed = threading.Condition()
        self._rng = random.Random(seed)
        self._seq = 0
        self.stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        #: Chooses the reply from the request's JSON body instead of the script (None: the script).
        self.responder: Callable[[Any], Reply] | None = None
        #: Seconds each chat request is held (counted in flight) before it is answered.
        self.latency_s = 0.0
        #: A provider's own limits: a request above them gets a 429 (None: no such limit).
        self.max_concurrent: int | None = None
        self.requests_per_minute: int | None = None
        #: Requests the rate bucket holds beyond one minute's worth (absorbs arrival jitter).
        self.rate_slack = 0.0
        #: Chat requests being answered now, the most ever at once, and the 429s sent, by reason.
        self.in_flight = 0
        self.peak_in_flight = 0
        self.rejected: dict[str, int] = {"concurrency": 0, "rate": 0}
        #: The Retry-After of those 429s, and when each arrived (``time.monotonic()``).
        self.retry_after = "1"
        self.rejected_at: list[float] = []
        self._bucket = 0.0
        self._bucket_at = 0.0

    # -- a provider's own limits --

    def enter(self) -> str | None:
        """A chat request arrives: counted in flight; the limit it breaks, if any (then answered 429)."""
        with self._changed:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            if self.max_concurrent is not None and self.in_flight > self.max_concurrent:
                self.rejected["concurrency"] += 1
                self.rejected_at.append(time.monotonic())
                return "concurrency"
            rpm = self.requests_per_minute
            if rpm is not None:
                # A token bucket of one minute's worth, refilled continuously, as providers document.
                now = time.monotonic()
                capacity = rpm + self.rate_slack
                if self._bucket_at == 0.0:
                    self._bucket = capacity
                else:
                    self._bucket = min(capacity, self._bucket + (now - self._bucket_at) * rpm / 60.0)
                self._bucket_at = now
                if self._bucket < 1.0:
                    self.rejected["rate"] += 1
                    self.rejected_at.append(now)
                    return "rate"
                self._bucket -= 1.0
            return None

    def leave(self) -> None:
        with self._changed:
            self.in_flight -= 1

    # -- lifecycle --

    def start(self) -> FakeProvider:
        self._server = _Server(self._address, self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.01},
            name=f"fake-{self.provider}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server.close_connections(timeout_s=5.0)
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- addresses --

    @property
    def provider(self) -> str:
        return self.renderer.name

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the fake provider is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def base_url(self) -> str:
        """What the provider's base URL variable (or ``OLLAMA_HOST``) should be set to."""
        return self.url + self.renderer.base_path

    def env(self, api_key: str = "sk-fake-key-0123456789") -> dict[str, str]:
        """Environment variables pointing a provider client here."""
        return self.renderer.env(self.base_url, api_key)

    # -- script and records --

    def enqueue(self, *replies: Reply) -> None:
        with self._changed:
            self._replies.extend(replies)

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._changed:
            return list(self._requests)

    def wait_for_requests(self, count: int, timeout_s: float = 5.0) -> list[RecordedRequest]:
        """Blocks until ``count`` requests arrived (or fails after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while len(self._requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{len(self._requests)} of {count} requests arrived within {timeout_s}s"
                    )
                self._changed.wait(left)
            return list(self._requests)

    def record(self, request: RecordedRequest) -> tuple[Reply | None, int]:
        """Records a request and takes the reply (None: script exhausted) and its number."""
        with self._changed:
            self._requests.append(request)
            self._seq += 1
            if self.responder is not None:
                reply: Reply | None = self.responder(request.body)
            else:
                reply = self._replies.popleft() if self._replies else self.default
            self._changed.notify_all()
            return reply, self._seq

    def split(self, payload: bytes, *, inside_characters: bool = False) -> list[bytes]:
        """``payload`` in chunks of random sizes within ``chunk_sizes``; ``inside_characters``
        also cuts every multi-byte character after its first byte."""
        low, high = self.chunk_sizes
        cuts: set[int] = set()
        with self._changed:
            at = 0
            while at < len(payload):
                at += self._rng.randint(low, high)
                cuts.add(min(at, len(payload)))
        if inside_characters:
            cuts.update(cut_points_inside_characters(payload))
        bounds = [0, *sorted(cuts - {0})]
        return [payload[start:end] for start, end in pairwise(bounds)]


class _Server(ThreadingHTTPServer):
    """Tracks its connections, so stop() can end even idle keep-alive ones and leave nothing open."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], fake: FakeProvider) -> None:
        self.fake = fake
        self._live: dict[socket.socket, threading.Thread] = {}
        self._live_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(target=self._serve, args=(request, client_address), daemon=True)
        with self._live_lock:
            self._live[request] = thread
        thread.start()

    def _serve(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except OSError:
            pass  # the client went away; faults do that on purpose
        finally:
            self.shutdown_request(request)
            with self._live_lock:
                self._live.pop(request, None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # broken connections are the point of many faults: keep test output clean

    def close_connections(self, timeout_s: float) -> None:
        with self._live_lock:
            live = list(self._live.items())
        for sock, _ in live:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s
        for _, thread in live:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # each tiny chunk leaves at once
    timeout = 30  # an idle keep-alive connection does not hold a thread forever
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    @property
    def fake(self) -> FakeProvider:
        return self.server.fake

    # -- routing --

    def do_GET(self) -> None:
        if self.path == "/_fake/requests":
            self._send_json(200, [r.to_json() for r in self.fake.requests])
        elif self.path == "/_fake/health":
            self._send_json(200, {"ok": True, "provider": self.fake.provider})
        else:
            self._send_json(
                404, self.fake.renderer.error_body("not_found_error", f"no route GET {self.path}")
            )

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        if self.path == "/_fake/replies":
            self.fake.enqueue(*(Reply.from_json(item) for item in body or []))
            self._send_json(200, {"ok": True})
            return
        headers = {name.lower(): value for name, value in self.headers.items()}
        renderer = self.fake.renderer
        if self.path.endswith(renderer.route):
            broken = self.fake.enter()
            # A whole (not streamed) answer leaves the provider's count before it is sent: the
            # client may send its next request the moment it has read this one, which can be
            # before this thread runs again, and that is not two requests at once.
            whole = broken is not None or not renderer.is_stream(body)
            try:
                if self.fake.latency_s:
                    self.fake.stopping.wait(self.fake.latency_s)
                if whole:
                    self.fake.leave()
                if broken is not None:
                    self.fake.record(RecordedRequest("POST", self.path, headers, body, time.monotonic()))
                    self._status_fault(
                        Fault.RATE_LIMIT, Reply(retry_after=self.fake.retry_after), renderer.key(headers)
                    )
                    return
                self._answer(headers, body)
            finally:
                if not whole:
                    self.fake.leave()
            return
        self._answer(headers, body)

    def _answer(self, headers: dict[str, str], body: Any) -> None:
        reply, seq = self.fake.record(RecordedRequest("POST", self.path, headers, body, time.monotonic()))
        renderer = self.fake.renderer
        if not self.path.endswith(renderer.route):
            self._send_json(404, renderer.error_body("not_found_error", f"no route POST {self.path}"))
        elif reply is None:
            self._send_json(
                409, renderer.error_body("fake_script_exhausted", f"no scripted reply for request {seq}")
            )
        else:
            self._play(reply, body, seq, renderer.key(headers))

    # -- answers --

    def _play(self, reply: Reply, body: Any, seq: int, key: str | None) -> None:
        renderer = self.fake.renderer
        fault = reply.fault
        stream = renderer.is_stream(body)
        model = body.get("model", "fake-model") if isinstance(body, dict) else "fake-model"
        if fault in STATUS_FAULTS:
            self._status_fault(fault, reply, key)
        elif fault is Fault.DISCONNECT:
            self.close_connection = True
        elif fault is Fault.STALL:
            self.fake.stopping.wait(self.fake.stall_s)
            self.close_connection = True
        elif stream:
            events = renderer.stream_events(reply, model, seq, body)
            self._stream(events, fault, inside_characters=reply.split_characters is Split.BYTES)
        elif fault in STREAM_ONLY_FAULTS:
            self._send_json(409, renderer.error_body("fake_misuse", f"fault {fault} applies to streams only"))
        elif fault is Fault.MALFORMED_BODY:
            self._send_bytes(
                200,
                b'{"id": "broken", "choices": [{"index": 0, "message": {"role": "assis',
                "application/json",
            )
        else:
            payload = renderer.answer(reply, body, seq)
            self._send_bytes(200, payload, "application/json", drop=fault is Fault.DROP)

    def _status_fault(self, fault: Fault, reply: Reply, key: str | None) -> None:
        status, headers, payload = self.fake.renderer.status_answer(fault, reply, key)
        self._send_bytes(status, payload, "application/json", headers=headers)

    def _stream(self, events: list[bytes], fault: Fault | None, *, inside_characters: bool = False) -> None:
        middle = len(events) // 2
        if fault in (Fault.MALFORMED_CHUNK, Fault.MALFORMED_BODY):
            events = [*events[:middle], self.fake.renderer.malformed_event(), *events[middle + 1 :]]
        elif fault is Fault.NO_TERMINATOR:
            events = events[:-1]
        elif fault is Fault.ERROR_EVENT:
            events = [*events[:middle], self.fake.renderer.error_event()]
        pieces = self.fake.split(b"".join(events), inside_characters=inside_characters)
        cut = max(1, len(pieces) // 2) if fault in (Fault.DROP, Fault.STALL_MID_STREAM) else None
        self.send_response(200)
        self.send_header("Content-Type", self.fake.renderer.stream_type)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for number, piece in enumerate(pieces):
            if number == cut:
                if fault is Fault.STALL_MID_STREAM:
                    self.fake.stopping.wait(self.fake.stall_s)
                self.close_connection = True  # no final chunk: the body is cut short
                return
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self.wfile.write(b"0\r\n\r\n")

    def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self._send_bytes(status, _dumps(body), "application/json", headers=headers)

    def _send_bytes(
        self,
        status: int,
        payload: bytes,
        content_type: str,
        *,
        headers: dict[str, str] | None = None,
        drop: bool = False,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        pieces = self.fake.split(payload)
        for piece in pieces[: max(1, len(pieces) // 2)] if drop else pieces:
            self.wfile.write(piece)
        if drop:
            self.close_connection = True


# --- Running as a process ---------------------------------------------------------------------


def load_script(path: str) -> tuple[list[Reply], Reply | None]:
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    if isinstance(data, list):
        data = {"replies": data}
    default = Reply.from_json(data["default"]) if data.get("default") else None
    return [Reply.from_json(item) for item in data.get("replies", [])], default


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--provider", choices=PROVIDERS, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--script", help="JSON file: a list of replies or {replies, default}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stall-s", type=float, default=30.0)
    args = parser.parse_args(argv)
    replies, default = load_script(args.script) if args.script else ([], None)
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    fake = FakeProvider(
        args.provider,
        replies,
        default=default,
        seed=args.seed,
        stall_s=args.stall_s,
        host=args.host,
        port=args.port,
    )
    with fake:
        print(fake.base_url, flush=True)
        while not done.wait(0.2):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
