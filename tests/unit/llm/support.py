"""Helpers for the provider adapter tests: fake servers, adapters pointed at them, stream checks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shared.llm.anthropic import AnthropicAdapter
from shared.llm.base import ModelRequest, ModelResponse, StreamPart, TextDelta, ToolSpec
from shared.llm.http import HttpSettings
from shared.llm.ollama import OllamaAdapter
from shared.llm.openai import OpenAIAdapter
from shared.messages import Message, UserMessage
from tests.fakeproviders import FakeProvider, Reply

API_KEY = "sk-test-9f8e7d6c5b4a39281706SECRET"

#: Small backoffs keep retry tests fast; the timeouts are still far above loopback latency.
FAST = HttpSettings(
    connect_timeout_s=2.0, max_attempts=3, backoff_base_s=0.005, backoff_max_s=0.02, retry_after_cap_s=5.0
)

Adapter = OpenAIAdapter | OllamaAdapter | AnthropicAdapter


def adapter_at(provider: str, base_url: str, settings: HttpSettings = FAST, **kwargs: Any) -> Adapter:
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
