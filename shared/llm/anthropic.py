"""Anthropic's Messages API (``anthropic:MODEL``).

Wire format: ``POST {base}/v1/messages`` with ``x-api-key`` and ``anthropic-version``;
``max_tokens`` is mandatory; system prompts go in the top-level ``system`` field; tools are
``{name, description, input_schema}``; calls are ``tool_use`` content blocks and results are
``tool_result`` blocks inside a *user* message (consecutive results share one message, as the
API requires). A whole answer's call input is an object and is passed on as one; a stream's
input arrives as ``partial_json`` text and is passed on as that text. Streams are SSE and end
with ``message_stop``: a stream without it was cut short and is an error, never an answer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from shared.errors import ConfigError
from shared.llm.adapter import HttpAdapter, raw_output
from shared.llm.base import ModelRequest, ModelResponse, RawToolCall, StreamPart, TextDelta, ToolSpec, Usage
from shared.llm.framing import SseEvent
from shared.llm.settings import HttpSettings
from shared.llm.text import SurrogateJoiner
from shared.llm.transport import SecretHeaderAuth
from shared.messages import AssistantMessage, Message, SystemMessage, ToolMessage, UserMessage

__all__ = [
    "API_VERSION",
    "AnthropicAdapter",
    "DEFAULT_BASE_URL",
    "DEFAULT_MAX_TOKENS",
    "RETRYABLE_ERRORS",
    "wire_conversation",
    "wire_tools",
    "TRUNCATED",
]

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
#: The ``stop_reason`` of an answer cut at ``max_tokens``.
TRUNCATED = "max_tokens"
#: In-band error types that may pass on a later attempt.
RETRYABLE_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})


# --- Requests ---------------------------------------------------------------------------------


def wire_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools]


def wire_conversation(messages: list[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    """The top-level system prompt and the user/assistant turns.

    Adjacent turns of one role are merged, which puts consecutive tool results into one user
    message; empty assistant turns are dropped because the API rejects empty content.
    """
    system = [m.content for m in messages if isinstance(m, SystemMessage)]
    turns: list[tuple[str, list[dict[str, Any]]]] = []
    for message in messages:
        if isinstance(message, SystemMessage):
            continue
        role, blocks = _blocks(message)
        if not blocks:
            continue
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    wire = [{"role": role, "content": _content(blocks)} for role, blocks in turns]
    return ("\n\n".join(system) if system else None), wire


def _blocks(message: UserMessage | AssistantMessage | ToolMessage) -> tuple[str, list[dict[str, Any]]]:
    if isinstance(message, UserMessage):
        return "user", [{"type": "text", "text": message.content}]
    if isinstance(message, ToolMessage):
        result = {
            "type": "tool_result",
            "tool_use_id": message.tool_call_id,
            "content": message.content,
            "is_error": message.is_error,
        }
        return "user", [result]
    blocks: list[dict[str, Any]] = []
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    blocks.extend(
        {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
        for call in message.tool_calls
    )
    return "assistant", blocks


def _content(blocks: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A lone text block is sent as a plain string, the API's simplest form."""
    if len(blocks) == 1 and blocks[0]["type"] == "text":
        text: str = blocks[0]["text"]
        return text
    return blocks


# --- Responses --------------------------------------------------------------------------------


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Block(_Wire):
    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None


class _Usage(_Wire):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None

    def prompt_tokens(self) -> int | None:
        """Cached prompt tokens are reported apart from ``input_tokens`` but are prompt all the
        same; counting them keeps totals comparable with other providers."""
        parts = [self.input_tokens, self.cache_creation_input_tokens, self.cache_read_input_tokens]
        return None if all(p is None for p in parts) else sum(p or 0 for p in parts)


class _Message(_Wire):
    content: list[_Block] = []
    stop_reason: str | None = None
    usage: _Usage = _Usage()


class _Delta(_Wire):
    type: str | None = None
    text: str | None = None
    partial_json: str | None = None
    stop_reason: str | None = None


class _Event(_Wire):
    type: str
    message: _Message | None = None
    index: int = 0
    content_block: _Block | None = None
    delta: _Delta | None = None
    usage: _Usage | None = None
    error: dict[str, Any] | None = None


class _StreamAssembler:
    """Folds stream events into one answer; blocks are kept by their index, and each block's
    pieces are joined so that a character cut between two pieces arrives whole."""

    def __init__(self) -> None:
        self.blocks: dict[int, _Block] = {}
        self.partial_json: dict[int, list[str]] = {}
        self._joiners: dict[int, SurrogateJoiner] = {}
        self.input_tokens = 0
        self.output_tokens = 0
        self.stop_reason: str | None = None

    def add(self, event: _Event) -> str:
        """Takes one event; returns its text delta ("" if none)."""
        if event.type == "message_start" and event.message is not None:
            self._count(event.message.usage)
        elif event.type == "content_block_start" and event.content_block is not None:
            self.blocks[event.index] = event.content_block.model_copy()
        elif event.type == "content_block_delta" and event.delta is not None:
            return self._delta(event.index, event.delta)
        elif event.type == "content_block_stop":
            return self._close(event.index)
        elif event.type == "message_delta":
            if event.delta is not None and event.delta.stop_reason:
                self.stop_reason = event.delta.stop_reason
            if event.usage is not None:
                self._count(event.usage)
        return ""

    def _count(self, usage: _Usage) -> None:
        # message_delta's counts are cumulative, so the latest figure wins.
        prompt = usage.prompt_tokens()
        self.input_tokens = self.input_tokens if prompt is None else prompt
        self.output_tokens = self.output_tokens if usage.output_tokens is None else usage.output_tokens

    def _delta(self, index: int, delta: _Delta) -> str:
        block = self.blocks.setdefault(
            index, _Block(type="text" if delta.type == "text_delta" else "tool_use")
        )
        joiner = self._joiners.setdefault(index, SurrogateJoiner())
        if delta.type == "text_delta" and delta.text:
            text = joiner.feed(delta.text)
            block.text = (block.text or "") + text
            return text
        if delta.type == "input_json_delta" and delta.partial_json is not None:
            self.partial_json.setdefault(index, []).append(joiner.feed(delta.partial_json))
        return ""

    def finish(self) -> str:
        """Completes every block still open; returns the text that adds to the answer."""
        return "".join(self._close(index) for index in sorted(self._joiners))

    def _close(self, index: int) -> str:
        """Completes block ``index``: a character its last piece left incomplete becomes U+FFFD.
        Returns the text that adds to the answer ("" if none)."""
        joiner = self._joiners.pop(index, None)
        rest = joiner.finish() if joiner is not None else ""
        if not rest:
            return ""
        block = self.blocks[index]
        if block.type == "text":
            block.text = (block.text or "") + rest
            return rest
        self.partial_json.setdefault(index, []).append(rest)
        return ""

    def response(self) -> ModelResponse:
        text_parts: list[str] = []
        calls: list[RawToolCall] = []
        for index, block in sorted(self.blocks.items()):
            if block.type == "text" and block.text:
                text_parts.append(block.text)
            elif block.type == "tool_use":
                joined = "".join(self.partial_json.get(index, []))
                # No (or only empty) input deltas: the input was given whole, {}, at the start.
                arguments = joined if joined.strip() else block.input
                calls.append(RawToolCall(id=block.id, name=block.name or "", arguments=arguments))
        text = "".join(text_parts) or None
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=Usage(input_tokens=self.input_tokens, output_tokens=self.output_tokens),
            finish_reason=self.stop_reason,
            truncated=self.stop_reason == TRUNCATED,
            raw=raw_output(text, calls),
        )


# --- The adapter ------------------------------------------------------------------------------


class AnthropicAdapter(HttpAdapter):
    """``anthropic:MODEL`` over the Messages API. The adapter is bound to ``model``."""

    provider = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        base_url: str = DEFAULT_BASE_URL,
        settings: HttpSettings | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        api_version: str = API_VERSION,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(model, settings=settings, transport=transport)
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"anthropic: base URL must start with http:// or https://, got {base_url!r}")
        if max_tokens < 1:
            raise ConfigError(f"anthropic: max_tokens must be positive, got {max_tokens}")
        self.base_url = base_url.rstrip("/")
        #: Used when the request sets no ``max_tokens``; the API has no default of its own.
        self.max_tokens = max_tokens
        self._url = f"{self.base_url}/v1/messages"
        self._http = self._connect(
            auth=SecretHeaderAuth({"x-api-key": api_key, "anthropic-version": api_version}),
            secrets=[api_key],
        )

    @classmethod
    def from_env(
        cls,
        model: str,
        *,
        settings: HttpSettings | None = None,
        environ: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> AnthropicAdapter:
        """Reads ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL`` as the official SDK does."""
        env = os.environ if environ is None else environ
        api_key = env.get("ANTHROPIC_API_KEY", "").strip()
        if not api_key:
            raise ConfigError(f"anthropic:{model} needs an API key: set ANTHROPIC_API_KEY")
        base_url = env.get("ANTHROPIC_BASE_URL", "").strip() or DEFAULT_BASE_URL
        return cls(model, api_key=api_key, base_url=base_url, settings=settings, transport=transport)

    def __repr__(self) -> str:
        return f"AnthropicAdapter(model={self.model!r}, base_url={self.base_url!r})"

    def body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        system, messages = wire_conversation(request.messages)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens or self.max_tokens,
            "messages": messages,
        }
        if system is not None:
            body["system"] = system
        if request.tools:
            body["tools"] = wire_tools(request.tools)
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if stream:
            body["stream"] = True
        return body

    def complete(self, request: ModelRequest) -> ModelResponse:
        payload = self._http.post_json(
            self._url, self.body(request, stream=False), timeout_s=request.timeout_s
        )
        try:
            message = _Message.model_validate(payload)
        except ValidationError as exc:
            raise self._http.error(
                f"malformed response body: {exc.error_count()} validation errors", body=json.dumps(payload)
            ) from None
        text = "".join(b.text or "" for b in message.content if b.type == "text") or None
        calls = [
            RawToolCall(id=b.id, name=b.name or "", arguments=b.input)
            for b in message.content
            if b.type == "tool_use"
        ]
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=Usage(
                input_tokens=message.usage.prompt_tokens() or 0,
                output_tokens=message.usage.output_tokens or 0,
            ),
            finish_reason=message.stop_reason,
            truncated=message.stop_reason == TRUNCATED,
            raw=raw_output(text, calls),
        )

    def stream(self, request: ModelRequest) -> Iterator[StreamPart]:
        assembler = _StreamAssembler()
        with self._http.stream_sse(
            self._url, self.body(request, stream=True), timeout_s=request.timeout_s
        ) as events:
            for sse in events:
                event = self._event(sse)
                if event.type == "message_stop":
                    rest = assembler.finish()
                    if rest:
                        yield TextDelta(text=rest)
                    break
                delta = assembler.add(event)
                if delta:
                    yield TextDelta(text=delta)
            else:
                raise self._http.error(
                    "stream ended without message_stop; the answer is incomplete", retryable=True
                )
        yield assembler.response()

    def _event(self, sse: SseEvent) -> _Event:
        payload = self._http.decode_json(sse.data, "stream event")
        if isinstance(payload, dict) and "type" not in payload:
            payload = {**payload, "type": sse.event}  # the SSE event name says the same
        try:
            event = _Event.model_validate(payload)
        except ValidationError as exc:
            raise self._http.error(
                f"malformed stream event: {exc.error_count()} validation errors", body=sse.data
            ) from None
        if event.type == "error":
            error = event.error or {}
            raise self._http.error(
                f"provider reported an error mid-stream: {json.dumps(error)}",
                retryable=error.get("type") in RETRYABLE_ERRORS,
            )
        return event
