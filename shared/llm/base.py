"""The contract between the runtime and a model provider.

Adapters are synchronous: a think task runs on a Celery worker thread, and ``httpx.Client`` is
thread-safe and keeps its connection pool across tasks (an ``AsyncClient`` would be tied to one
event loop per task). An adapter translates the wire format and its transport failures
(:class:`shared.errors.ModelTransport`) and nothing more: deciding whether a tool call is valid
(unknown tool, arguments that are not JSON, arguments failing validation) belongs to the runtime,
so an adapter passes tool calls through raw.

Text leaving an adapter is always well-formed: every string of a :class:`TextDelta`,
:class:`ModelResponse` and :class:`RawToolCall` has any lone surrogate (which no event or
message could be serialised with) replaced by U+FFFD when the object is built.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.llm.text import clean_json_text, clean_text, clean_value
from shared.messages import Message

__all__ = [
    "LlmAdapter",
    "ModelRequest",
    "ModelResponse",
    "OutputFormat",
    "RawToolCall",
    "StreamPart",
    "TextDelta",
    "ToolSpec",
    "Usage",
]


class ToolSpec(BaseModel):
    """What a model is told about one tool; ``parameters`` is a generated JSON schema."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    parameters: dict[str, Any]


class Usage(BaseModel):
    """Tokens a model call (or a whole run) consumed."""

    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


class RawToolCall(BaseModel):
    """A tool call exactly as the model produced it: untrusted until the runtime validates it.

    ``arguments`` is a string for providers that send JSON text (OpenAI, Anthropic streams) and
    an object for those that send objects (Ollama).
    """

    id: str | None = None
    name: str
    arguments: str | dict[str, Any] | list[Any] | int | float | bool | None = None

    @field_validator("id", "name")
    @classmethod
    def _clean_names(cls, value: str | None) -> str | None:
        return None if value is None else clean_text(value)

    @field_validator("arguments")
    @classmethod
    def _clean_arguments(cls, value: Any) -> Any:
        # JSON text is decoded later, by the runtime: its escapes of lone surrogates go too.
        return clean_json_text(value) if isinstance(value, str) else clean_value(value)


class OutputFormat(BaseModel):
    """The shape a final answer must have: a name and a JSON schema (sent to providers that take one)."""

    model_config = ConfigDict(frozen=True)

    name: str
    schema_: dict[str, Any]

    def schema_text(self) -> str:
        return json.dumps(self.schema_, sort_keys=True)


class ModelRequest(BaseModel):
    """What a think phase asks a model: the conversation and the tools on offer."""

    model: str
    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)
    temperature: float | None = None
    max_tokens: int | None = None
    #: The longest wait for the next byte of the answer; None: the adapter's setting
    #: (``HttpSettings.read_timeout_s``, which workers take from ``LlmSettings``).
    timeout_s: float | None = None
    #: The shape the final answer must have (``shared/output.py``): an adapter whose provider has
    #: a native JSON-schema mode sends it; the others ignore it (the prompt carries instructions).
    output: OutputFormat | None = None


class ModelResponse(BaseModel):
    """A model's answer: text and/or raw tool calls, untrusted until the runtime validates them."""

    text: str | None = None
    tool_calls: list[RawToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str | None = None
    #: The provider stopped the answer at its output token limit (OpenAI ``finish_reason: length``,
    #: Anthropic ``stop_reason: max_tokens``, Ollama ``done_reason: length``): the text is cut off.
    #: Each adapter maps its provider's reason; the agent's policy says what a cut answer does.
    truncated: bool = False
    #: The model's raw text (bounded), kept for ``InvalidModelAction.raw`` when parsing fails.
    raw: str | None = None

    @field_validator("text", "finish_reason", "raw")
    @classmethod
    def _clean(cls, value: str | None) -> str | None:
        return None if value is None else clean_text(value)


class TextDelta(BaseModel):
    """A piece of streamed answer text."""

    text: str

    @field_validator("text")
    @classmethod
    def _clean(cls, value: str) -> str:
        return clean_text(value)


#: A stream yields text deltas as they arrive and ends with exactly one ModelResponse.
StreamPart = TextDelta | ModelResponse


@runtime_checkable
class LlmAdapter(Protocol):
    """A model provider. Implementations raise :class:`shared.errors.ModelTransport` on failure."""

    def complete(self, request: ModelRequest) -> ModelResponse: ...

    def stream(self, request: ModelRequest) -> Iterator[StreamPart]: ...
