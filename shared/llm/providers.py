"""Model strings to adapters: ``openai:gpt-4o``, ``ollama:llama3``, ``anthropic:claude-...``,
and ``react+PROVIDER:MODEL`` for a model without native tool calling.

Settings come from the environment, read when the adapter is built; a missing key is a
:class:`~shared.errors.ConfigError` naming the variable to set, raised before any run starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from shared.errors import ConfigError
from shared.llm.anthropic import AnthropicAdapter
from shared.llm.base import LlmAdapter
from shared.llm.names import split_model_string
from shared.llm.ollama import OllamaAdapter
from shared.llm.openai import OpenAIAdapter
from shared.llm.react import ReActAdapter
from shared.llm.settings import HttpSettings

__all__ = ["PROVIDERS", "build_adapter"]

_FACTORIES: dict[str, Callable[..., LlmAdapter]] = {
    "openai": OpenAIAdapter.from_env,
    "ollama": OllamaAdapter.from_env,
    "anthropic": AnthropicAdapter.from_env,
}
PROVIDERS = tuple(sorted(_FACTORIES))


def build_adapter(
    model_string: str,
    *,
    settings: HttpSettings | None = None,
    environ: Mapping[str, str] | None = None,
    fallback: Callable[[str], LlmAdapter] | None = None,
) -> LlmAdapter:
    """The adapter for ``model_string``.

    ``fallback`` builds providers this module does not know (given ``PROVIDER:MODEL`` without
    the react prefix), so a caller's own providers can also be wrapped in ReAct.
    """
    react, provider, model = split_model_string(model_string)
    factory = _FACTORIES.get(provider)
    if factory is not None:
        adapter = factory(model, settings=settings, environ=environ)
    elif fallback is not None:
        adapter = fallback(f"{provider}:{model}")
    else:
        raise ConfigError(
            f"unknown model provider {provider!r} in {model_string!r}; known: {', '.join(PROVIDERS)}"
        )
    return ReActAdapter(adapter) if react else adapter
