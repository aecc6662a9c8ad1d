"""OpenAI Chat Completions (``openai:MODEL``), also spoken by many compatible servers.

Wire format: ``POST {base}/chat/completions`` with ``Authorization: Bearer``; tools as
``{"type": "function", "function": {...}}``; tool call arguments travel as JSON *text* and are
passed on raw. Streams are SSE chunks whose tool calls arrive in pieces keyed by ``index`` and
end with ``data: [DONE]``: a stream without it was cut short and is an error, never an answer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

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
    "DEFAULT_BASE_URL",
    "DONE",
    "OpenAIAdapter",
    "wire_message",
    "wire_tools",
    "TRUNCATED",
]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DONE = "[DONE]"
#: The ``finish_reason`` of an answer cut at ``max_completion_tokens`` (or the context's end).
TRUNCATED = "length"


# --- Requests ---------------------------------------------------------------------------------


def wire_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def wire_message(message: Message) -> dict[str, Any]:
    if isinstance(message, SystemMessage | UserMessage):
        return {"role": message.role, "content": message.content}
    if isinstance(message, ToolMessage):
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    return _wire_assistant(message)


def _wire_assistant(message: AssistantMessage) -> dict[str, Any]:
    if not message.tool_calls:
        return {"role": "assistant", "content": message.content or ""}
    return {
        "role": "assistant",
        "content": message.content or None,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
            }
            for call in message.tool_calls
        ],
    }


# --- Responses (only the fields we read; providers add fields freely) -------------------------


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Function(_Wire):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(_Wire):
    index: int | None = None
    id: str | None = None
    function: _Function | None = None


class _Message(_Wire):
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(_Wire):
    index: int = 0
    message: _Message | None = None
    delta: _Message | None = None
    finish_reason: str | None = None


class _Usage(_Wire):
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def usage(self) -> Usage:
        return Usage(input_tokens=self.prompt_tokens, output_tokens=self.completion_tokens)


class _Completion(_Wire):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: dict[str, Any] | str | None = None


@dataclass
class _PartialCall:
    """One tool call being streamed: id and name come whole (usually first), arguments in pieces
    (joined so that a character cut between two pieces arrives whole)."""

    id: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)
    _joiner: SurrogateJoiner = field(default_factory=SurrogateJoiner)

    def add(self, piece: _ToolCall) -> None:
        # Some compatible servers repeat the id and name in later pieces: the first one wins.
        self.id = self.id or piece.id
        if piece.function is not None:
            self.name = self.name or piece.function.name
            if piece.function.arguments:
                self.arguments.append(self._joiner.feed(piece.function.arguments))

    def call(self) -> RawToolCall:
        arguments = "".join([*self.arguments, self._joiner.finish()])
        return RawToolCall(id=self.id, name=self.name or "", arguments=arguments)


class _StreamAssembler:
    """Folds chunks into one answer: text pieces joined, tool call pieces joined by index."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self._joiner = SurrogateJoiner()
        self.calls: dict[int, _PartialCall] = {}
        self.finish_reason: str | None = None
        self.usage = Usage()

    def add(self, chunk: _Completion) -> str:
        """Takes one chunk; returns its text delta ("" if none)."""
        if chunk.usage is not None:
            self.usage = chunk.usage.usage()
        choice = next((c for c in chunk.choices if c.index == 0), None)
        if choice is None or choice.delta is None:
            return ""
        self.finish_reason = choice.finish_reason or self.finish_reason
        for position, piece in enumerate(choice.delta.tool_calls or []):
            index = position if piece.index is None else piece.index
            self.calls.setdefault(index, _PartialCall()).add(piece)
        return self._text(self._joiner.feed((choice.delta.content or "") + (choice.delta.refusal or "")))

    def finish(self) -> str:
        """The text a character left incomplete by the last piece becomes ("" if none)."""
        return self._text(self._joiner.finish())

    def _text(self, delta: str) -> str:
        if delta:
            self.text.append(delta)
        return delta

    def response(self) -> ModelResponse:
        calls = [partial.call() for _, partial in sorted(self.calls.items())]
        text = "".join(self.text) or None
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=self.usage,
            finish_reason=self.finish_reason,
            truncated=self.finish_reason == TRUNCATED,
            raw=raw_output(text, calls),
        )


# --- The adapter ------------------------------------------------------------------------------


class OpenAIAdapter(HttpAdapter):
    """``openai:MODEL`` over Chat Completions. The adapter is bound to ``model``;
    ``ModelRequest.model`` names the run's model string and is not sent."""

    provider = "openai"
    #: Takes the final answer's JSON schema natively (``response_format``).
    native_output: ClassVar[bool] = True

    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        base_url: str = DEFAULT_BASE_URL,
        settings: HttpSettings | None = None,
        max_tokens_field: str = "max_completion_tokens",
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(model, settings=settings, transport=transport)
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"openai: base URL must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        #: ``max_tokens`` is deprecated upstream but some compatible servers only know it.
        self.max_tokens_field = max_tokens_field
        self._url = f"{self.base_url}/chat/completions"
        self._http = self._connect(
            auth=SecretHeaderAuth({"Authorization": f"Bearer {api_key}"}), secrets=[api_key]
        )

    @classmethod
    def from_env(
        cls,
        model: str,
        *,
        settings: HttpSettings | None = None,
        environ: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> OpenAIAdapter:
        """Reads ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL`` as the official SDK does."""
        env = os.environ if environ is None else environ
        api_key = env.get("OPENAI_API_KEY", "").strip()
        if not api_key:
            raise ConfigError(f"openai:{model} needs an API key: set OPENAI_API_KEY")
        base_url = env.get("OPENAI_BASE_URL", "").strip() or DEFAULT_BASE_URL
        return cls(model, api_key=api_key, base_url=base_url, settings=settings, transport=transport)

    def __repr__(self) -> str:
        return f"OpenAIAdapter(model={self.model!r}, base_url={self.base_url!r})"

    def body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": [wire_message(m) for m in request.messages]}
        if request.tools:
            body["tools"] = wire_tools(request.tools)
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.max_tokens is not None:
            body[self.max_tokens_field] = request.max_tokens
        if request.output is not None:
            # Structured outputs; not strict: a strict schema needs every property required.
            schema = {"name": request.output.name, "schema": request.output.schema_, "strict": False}
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def complete(self, request: ModelRequest) -> ModelResponse:
        payload = self._http.post_json(
            self._url, self.body(request, stream=False), timeout_s=request.timeout_s
        )
        completion = self._parse(payload, "response body")
        choice = next((c for c in completion.choices if c.index == 0), None)
        if choice is None or choice.message is None:
            raise self._http.error("response has no choices[0].message", body=json.dumps(payload))
        message = choice.message
        calls = [
            RawToolCall(
                id=call.id,
                name=(call.function.name if call.function else None) or "",
                arguments=call.function.arguments if call.function else None,
            )
            for call in message.tool_calls or []
        ]
        text = message.content if message.content else message.refusal
        return ModelResponse(
            text=text or None,
            tool_calls=calls,
            usage=completion.usage.usage() if completion.usage else Usage(),
            finish_reason=choice.finish_reason,
            truncated=choice.finish_reason == TRUNCATED,
            raw=raw_output(text or None, calls),
        )

    def stream(self, request: ModelRequest) -> Iterator[StreamPart]:
        body = self.body(request, stream=True)
        assembler = _StreamAssembler()
        with self._http.stream_sse(self._url, body, timeout_s=request.timeout_s) as events:
            for event in events:
                if event.data.strip() == DONE:
                    rest = assembler.finish()
                    if rest:
                        yield TextDelta(text=rest)
                    break
                delta = assembler.add(self._chunk(event))
                if delta:
                    yield TextDelta(text=delta)
            else:
                raise self._http.error(
                    "stream ended without data: [DONE]; the answer is incomplete", retryable=True
                )
        yield assembler.response()

    def _chunk(self, event: SseEvent) -> _Completion:
        payload = self._http.decode_json(event.data, "stream chunk")
        return self._parse(payload, "stream chunk")

    def _parse(self, payload: Any, what: str) -> _Completion:
        try:
            completion = _Completion.model_validate(payload)
        except ValidationError as exc:
            raise self._http.error(
                f"malformed {what}: {exc.error_count()} validation errors", body=json.dumps(payload)
            ) from None
        if completion.error is not None:
            raise self._http.error(
                f"provider reported an error: {json.dumps(completion.error)}",
                retryable=_retryable(completion.error),
            )
        return completion


def _retryable(error: dict[str, Any] | str) -> bool:
    """In-band errors of a server-side kind may pass on a later attempt."""
    kind = error.get("type") if isinstance(error, dict) else None
    return kind in {"server_error", "rate_limit_error", "overloaded_error", "timeout"}
