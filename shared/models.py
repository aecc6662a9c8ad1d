"""Model strings (``PROVIDER:MODEL``) to adapters, cached per process so connection pools are reused."""

from __future__ import annotations

import threading

from shared.agents import AgentRegistry
from shared.errors import ConfigError
from shared.llm.base import LlmAdapter
from shared.llm.scripted import ScriptedModel, load_script

_lock = threading.Lock()
_cache: dict[str, LlmAdapter] = {}


def resolve_model(model: str, registry: AgentRegistry, *, trusted: bool = False) -> LlmAdapter:
    provider, _, name = model.partition(":")
    if not name:
        raise ConfigError(f"model {model!r} must look like PROVIDER:MODEL")
    if provider == "scripted":
        registered = registry.model(name)
        if registered is not None:
            return registered
        if not trusted:
            raise ConfigError(
                f"scripted model {name!r} is not registered in the agents module; a run may only"
                " name a scripted file if its agent does"
            )
    with _lock:
        adapter = _cache.get(model)
        if adapter is None:
            adapter = _build(provider, name, model)
            _cache[model] = adapter
        return adapter


def _build(provider: str, name: str, model: str) -> LlmAdapter:
    if provider == "scripted":
        if name.endswith(".json"):
            return ScriptedModel(load_script(name))
        raise ConfigError(
            f"scripted model {name!r} is neither registered in the agents module nor a .json file"
        )
    try:
        from shared.llm.providers import build_adapter
    except ImportError as exc:  # pragma: no cover - the providers module ships with the package
        raise ConfigError(f"provider {provider!r} is not available: {exc}") from exc
    return build_adapter(model)
