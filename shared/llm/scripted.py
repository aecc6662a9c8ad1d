"""A scripted model for tests, demos and benchmarks: no network, fully deterministic.

It is stateless across processes: the reply is chosen from the conversation itself (by default,
the number of assistant turns so far), so any worker that picks up a think phase gives the same
answer as any other would have.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from shared.errors import ConfigError, ModelTransport
from shared.llm.base import ModelRequest, ModelResponse, RawToolCall, StreamPart, TextDelta, Usage
from shared.messages import AssistantMessage, Message

__all__ = ["ScriptFn", "ScriptedModel", "load_script", "reply"]

ScriptFn = Callable[[Sequence[Message]], ModelResponse]


def reply(text: str | None = None, *calls: tuple[str, Any]) -> ModelResponse:
    """Build a scripted reply: ``reply("done")`` or ``reply(None, ("add", {"a": 1, "b": 2}))``."""
    tool_calls = [
        RawToolCall(id=f"call_{i}", name=name, arguments=args) for i, (name, args) in enumerate(calls)
    ]
    return ModelResponse(text=text, tool_calls=tool_calls, usage=Usage(input_tokens=10, output_tokens=5))


class ScriptedModel:
    """Replies from a list (indexed by assistant turns so far) or from a function of the conversation.

    ``latency_s`` simulates provider latency; ``chunk`` controls how the text is streamed.
    A reply that is the string ``"!transport"`` raises a retryable :class:`ModelTransport`.
    """

    def __init__(
        self, script: Sequence[ModelResponse] | ScriptFn, *, latency_s: float = 0.0, chunk: int = 8
    ) -> None:
        self._script = script
        self.latency_s = latency_s
        self.chunk = max(1, chunk)

    def _pick(self, messages: Sequence[Message]) -> ModelResponse:
        if callable(self._script):
            return self._script(messages)
        turn = sum(1 for m in messages if isinstance(m, AssistantMessage))
        if turn >= len(self._script):
            raise ModelTransport(f"scripted model has no reply for turn {turn}", retryable=False)
        return self._script[turn]

    def complete(self, request: ModelRequest) -> ModelResponse:
        if self.latency_s:
            time.sleep(self.latency_s)
        response = self._pick(request.messages)
        if response.text == "!transport":
            raise ModelTransport("scripted transport failure", status_code=503, retryable=True)
        return response

    def stream(self, request: ModelRequest) -> Iterator[StreamPart]:
        response = self.complete(request)
        text = response.text or ""
        for i in range(0, len(text), self.chunk):
            yield TextDelta(text=text[i : i + self.chunk])
        yield response


def load_script(path: str) -> list[ModelResponse]:
    """A JSON file: a list of replies, each ``{"text": ..., "tool_calls": [{"name", "arguments"}]}``."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read scripted model file {path!r}: {exc}") from exc
    if not isinstance(data, list):
        raise ConfigError(f"scripted model file {path!r} must hold a JSON list of replies")
    replies = []
    for i, item in enumerate(data):
        calls = [
            RawToolCall(id=c.get("id", f"call_{j}"), name=c["name"], arguments=c.get("arguments"))
            for j, c in enumerate(item.get("tool_calls", []))
        ]
        replies.append(
            ModelResponse(
                text=item.get("text"), tool_calls=calls, usage=Usage(input_tokens=10, output_tokens=5)
            )
        )
        if not replies[-1].text and not calls:
            raise ConfigError(f"scripted reply {i} in {path!r} has neither text nor tool_calls")
    return replies
