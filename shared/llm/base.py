"""The contract between the runtime and a model provider.

Adapters are synchronous: a think task runs on a Celery worker thread, and ``httpx.Client`` is
thread-safe and keeps its connection pool across tasks (an ``AsyncClient`` would be tied to one
event loop per task). An adapter translates the wire format and its transport failures
(:class:`shared.errors.ModelTransport`) and nothing more: deciding whether a tool call is valid
(unknown tool, arguments that are not JSON, arguments failing validation) belongs to the runtime,
so an adapter passes tool calls through raw.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from shared.messages import Message


class ToolSpec(BaseModel):
    """What a model is told about one tool; ``parameters`` is a generated JSON schema."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    parameters: dict[str, Any]


class Usage(BaseModel):
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


class ModelRequest(BaseModel):
    model: str
    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)
    temperature: float | None = None
    max_tokens: int | None = None
    timeout_s: float = 120.0


class ModelResponse(BaseModel):
    text: str | None = None
    tool_calls: list[RawToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str | None = None
    #: The model's raw text (bounded), kept for ``InvalidModelAction.raw`` when parsing fails.
    raw: str | None = None


class TextDelta(BaseModel):
    text: str


#: A stream yields text deltas as they arrive and ends with exactly one ModelResponse.
StreamPart = TextDelta | ModelResponse


@runtime_checkable
class LlmAdapter(Protocol):
    """A model provider. Implementations raise :class:`shared.errors.ModelTransport` on failure."""

    def complete(self, request: ModelRequest) -> ModelResponse: ...

    def stream(self, request: ModelRequest) -> Iterator[StreamPart]: ...
