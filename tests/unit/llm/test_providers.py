"""Model strings to adapters."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.errors import ConfigError
from shared.llm.anthropic import AnthropicAdapter
from shared.llm.base import LlmAdapter, ModelRequest, ModelResponse, StreamPart
from shared.llm.names import split_model_string
from shared.llm.ollama import OllamaAdapter
from shared.llm.openai import OpenAIAdapter
from shared.llm.providers import build_adapter
from shared.llm.react import ReActAdapter
from tests.unit.llm.support import API_KEY

ENV = {"OPENAI_API_KEY": API_KEY, "ANTHROPIC_API_KEY": API_KEY, "OLLAMA_HOST": "gpu-box:11500"}


def close(adapter: LlmAdapter) -> None:
    closer = getattr(adapter, "close", None)
    assert callable(closer)
    closer()


@pytest.mark.parametrize(
    ("model_string", "kind", "model"),
    [
        ("openai:gpt-4o-mini", OpenAIAdapter, "gpt-4o-mini"),
        ("anthropic:claude-sonnet-4-5", AnthropicAdapter, "claude-sonnet-4-5"),
        ("ollama:llama3:8b", OllamaAdapter, "llama3:8b"),
        ("  OpenAI:gpt-4o ", OpenAIAdapter, "gpt-4o"),
    ],
)
def test_builds_each_provider(model_string: str, kind: type, model: str) -> None:
    adapter = build_adapter(model_string, environ=ENV)
    try:
        assert isinstance(adapter, kind)
        assert isinstance(adapter, LlmAdapter)
        assert adapter.model == model  # type: ignore[attr-defined]
    finally:
        close(adapter)


def test_react_prefix_wraps() -> None:
    adapter = build_adapter("react+ollama:llama3", environ=ENV)
    try:
        assert isinstance(adapter, ReActAdapter)
        assert isinstance(adapter.inner, OllamaAdapter)
        assert adapter.inner.host == "http://gpu-box:11500"
    finally:
        close(adapter)


def test_reads_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    adapter = build_adapter("openai:gpt-4o")
    try:
        assert isinstance(adapter, OpenAIAdapter) and adapter.base_url == "http://127.0.0.1:9/v1"
    finally:
        close(adapter)


@pytest.mark.parametrize(
    ("model_string", "variable"),
    [("openai:gpt-4o", "OPENAI_API_KEY"), ("react+anthropic:claude", "ANTHROPIC_API_KEY")],
)
def test_missing_key_names_the_variable(model_string: str, variable: str) -> None:
    with pytest.raises(ConfigError, match=f"set {variable}"):
        build_adapter(model_string, environ={})


@pytest.mark.parametrize("model_string", ["gpt-4o", "openai:", ":gpt-4o", "react+", ""])
def test_malformed_model_strings(model_string: str) -> None:
    with pytest.raises(ConfigError, match="PROVIDER:MODEL"):
        build_adapter(model_string, environ=ENV)


def test_unknown_provider_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown model provider 'mistral'.*anthropic, ollama, openai"):
        build_adapter("mistral:large", environ=ENV)


class Canned:
    def complete(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse(text="Final Answer: canned")

    def stream(self, request: ModelRequest) -> Iterator[StreamPart]:
        yield self.complete(request)


def test_fallback_builds_other_providers_and_react_wraps_them() -> None:
    seen: list[str] = []

    def fallback(model_string: str) -> LlmAdapter:
        seen.append(model_string)
        return Canned()

    adapter = build_adapter("react+scripted:demo", environ={}, fallback=fallback)
    assert seen == ["scripted:demo"]
    assert isinstance(adapter, ReActAdapter)
    assert adapter.complete(ModelRequest(model="m", messages=[])).text == "canned"


def test_split_model_string() -> None:
    assert split_model_string("react+ollama:qwen2.5:7b") == (True, "ollama", "qwen2.5:7b")
    assert split_model_string("openai:gpt-4o") == (False, "openai", "gpt-4o")
