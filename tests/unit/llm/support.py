"""Helpers for the provider adapter tests: fake servers, adapters pointed at them, stream checks,
and the same providers over ``httpx.MockTransport`` (no sockets) with bodies cut as a test says."""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from shared.llm.anthropic import AnthropicAdapter
from shared.llm.base import ModelRequest, ModelResponse, StreamPart, TextDelta, ToolSpec
from shared.llm.ollama import OllamaAdapter
from shared.llm.openai import OpenAIAdapter
from shared.llm.settings import HttpSettings
from shared.messages import Message, UserMessage
from tests.fakeproviders import RENDERERS, STATUS_FAULTS, FakeProvider, Reply

API_KEY = "sk-test-9f8e7d6c5b4a39281706SECRET"

#: Small backoffs keep retry tests fast; the timeouts are still far above loopback latency.
FAST = HttpSettings(
    connect_timeout_s=2.0, max_attempts=3, backoff_base_s=0.005, backoff_max_s=0.02, retry_after_cap_s=5.0
)

Adapter = OpenAIAdapter | OllamaAdapter | AnthropicAdapter


def adapter_at(provider: str, base_url: str, settings: HttpSettings = FAST, **kwargs: Any) -> Adapter:
    """An adapter for ``provider`` at ``base_url``; ``kwargs`` go to its constructor (``transport``)."""
    if provider == "openai":
        return OpenAIAdapter("gpt-4o-mini", api_key=API_KEY, base_url=base_url, settings=settings, **kwargs)
    if provider == "anthropic":
        return AnthropicAdapter(
            "claude-sonnet-4-5", api_key=API_KEY, base_url=base_url, settings=settings, **kwargs
        )
    return OllamaAdapter("llama3.2", host=base_url, settings=settings, **kwargs)


def adapter_for(fake: FakeProvider, settings: HttpSettings = FAST, **kwargs: Any) -> Adapter:
    return adapter_at(fake.provider, fake.base_url, settings, **kwargs)


class Harness:
    """Starts fakes and adapters for one test and closes them all afterwards."""

    def __init__(self) -> None:
        self._fakes: list[FakeProvider] = []
        self._adapters: list[Adapter] = []

    def fake(self, provider: str, *replies: Reply, **kwargs: Any) -> FakeProvider:
        fake = FakeProvider(provider, replies, **kwargs).start()
        self._fakes.append(fake)
        return fake

    def adapter(self, fake: FakeProvider, settings: HttpSettings = FAST, **kwargs: Any) -> Adapter:
        adapter = adapter_for(fake, settings, **kwargs)
        self._adapters.append(adapter)
        return adapter

    def pair(
        self, provider: str, *replies: Reply, settings: HttpSettings = FAST
    ) -> tuple[FakeProvider, Adapter]:
        fake = self.fake(provider, *replies)
        return fake, self.adapter(fake, settings)

    def track(self, adapter: Adapter) -> Adapter:
        self._adapters.append(adapter)
        return adapter

    def close(self) -> None:
        for adapter in self._adapters:
            adapter.close()
        for fake in self._fakes:
            fake.stop()


def drain(parts: Iterable[StreamPart]) -> tuple[list[str], ModelResponse]:
    """A stream's text deltas and its final response, checking the stream contract: deltas,
    then exactly one ModelResponse, last."""
    deltas: list[str] = []
    finals: list[ModelResponse] = []
    for part in parts:
        assert not finals, "nothing may follow the final ModelResponse"
        if isinstance(part, TextDelta):
            deltas.append(part.text)
        else:
            finals.append(part)
    assert len(finals) == 1
    return deltas, finals[0]


WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def request(*messages: Message, tools: list[ToolSpec] | None = None, **kwargs: Any) -> ModelRequest:
    return ModelRequest(
        model="test-model",
        messages=list(messages) or [UserMessage(content="hi")],
        tools=tools or [],
        **kwargs,
    )


# --- The providers over httpx.MockTransport ----------------------------------------------------------


def every_byte(data: bytes) -> list[bytes]:
    """A body cut after every byte: every multi-byte character arrives in pieces."""
    return [data[at : at + 1] for at in range(len(data))]


def whole(data: bytes) -> list[bytes]:
    return [data] if data else []


class Chunks(httpx.SyncByteStream):
    """A response body delivered in exactly these chunks."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks = list(chunks)

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks


@dataclass(frozen=True)
class Seen:
    request: httpx.Request
    body: Any
    at: float  # time.monotonic() on arrival


class MockProvider:
    """One provider's API as an ``httpx.MockTransport``: answers each request with the next
    scripted reply, written by the fake servers' renderers (answers, streams and status faults)
    and cut into chunks by ``cut``; records every request."""

    def __init__(
        self, provider: str, *replies: Reply, cut: Callable[[bytes], list[bytes]] = every_byte
    ) -> None:
        self.provider = provider
        self.renderer = RENDERERS[provider]()
        self.replies = deque(replies)
        self.cut = cut
        self.seen: list[Seen] = []
        self.transport = httpx.MockTransport(self._answer)

    def _answer(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.seen.append(Seen(request, body, time.monotonic()))
        reply = self.replies.popleft()
        if reply.fault in STATUS_FAULTS:
            key = self.renderer.key({k.lower(): v for k, v in request.headers.items()})
            status, headers, payload = self.renderer.status_answer(reply.fault, reply, key)
            return httpx.Response(status, headers=headers, stream=Chunks(self.cut(payload)))
        assert reply.fault is None, "MockProvider plays answers and status faults only"
        content_type = self.renderer.stream_type if self.renderer.is_stream(body) else "application/json"
        payload = self.renderer.answer(reply, body, len(self.seen))
        return httpx.Response(200, headers={"content-type": content_type}, stream=Chunks(self.cut(payload)))

    def adapter(self, settings: HttpSettings = FAST, **kwargs: Any) -> Adapter:
        return adapter_at(self.provider, "http://provider.test", settings, transport=self.transport, **kwargs)
