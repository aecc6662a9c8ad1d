"""Model strings (``PROVIDER:MODEL``) to adapters, for the think phase of the workers.

Adapters are cached per process so their connection pools are reused, in a small LRU: a run may
name any model string, and an adapter per distinct string kept forever would grow a worker
without bound. An evicted adapter is retired: its connection pool closes as soon as no call uses
it.

``scripted:NAME`` is a model registered in the agents module (``registry.add_model``), or a
JSON file of replies. A model string may come from whoever submits a run, so a file is only read

* when the string is trusted: the agent's own model (the worker says so with ``trusted=True``),
  or any agent's model as written in the agents module (the operator chose that file), or
* when the file lies, symlinks and ``..`` resolved, inside the directory set by
  ``WESICHAIN_SCRIPTS_DIR`` (a relative name is taken relative to it).

Anything else is refused with a :class:`~shared.errors.ConfigError` before the file is opened.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

from shared.agents import AgentRegistry
from shared.errors import ConfigError
from shared.llm.base import LlmAdapter
from shared.llm.scripted import ScriptedModel, load_script
from shared.llm.settings import ENV_SCRIPTS_DIR, LlmSettings

__all__ = [
    "AdapterCache",
    "CACHE",
    "CACHE_SIZE",
    "SCRIPTED",
    "is_agents_model",
    "resolve_model",
    "retire",
    "script_path",
]

SCRIPTED = "scripted"
#: Adapters kept per process. A worker serves a handful of models; 32 leaves room for many more
#: while bounding what distinct model strings can cost (about 1 MB per adapter and its pool).
CACHE_SIZE = 32


class AdapterCache:
    """At most ``size`` adapters, the least recently used evicted first. Thread-safe."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        if size < 1:
            raise ConfigError(f"adapter cache size must be at least 1, got {size}")
        self.size = size
        self._lock = threading.Lock()
        self._adapters: OrderedDict[Hashable, LlmAdapter] = OrderedDict()

    def get(self, key: Hashable, build: Callable[[], LlmAdapter]) -> LlmAdapter:
        """The adapter cached under ``key``, or a new one from ``build`` (which may evict the
        least recently used one, which is then retired)."""
        evicted: list[LlmAdapter] = []
        with self._lock:
            adapter = self._adapters.get(key)
            if adapter is not None:
                self._adapters.move_to_end(key)
                return adapter
            adapter = build()  # under the lock: two threads never build (and leak) the same one
            self._adapters[key] = adapter
            while len(self._adapters) > self.size:
                evicted.append(self._adapters.popitem(last=False)[1])
        for old in evicted:
            retire(old)
        return adapter

    def __len__(self) -> int:
        with self._lock:
            return len(self._adapters)

    def clear(self) -> None:
        """Retires every cached adapter."""
        with self._lock:
            adapters = list(self._adapters.values())
            self._adapters.clear()
        for adapter in adapters:
            retire(adapter)


def retire(adapter: LlmAdapter) -> None:
    """Closes an adapter's connections once no call uses them (at once if it cannot wait)."""
    close = getattr(adapter, "retire", None) or getattr(adapter, "close", None)
    if callable(close):
        close()


#: The process's adapters.
CACHE = AdapterCache()


def resolve_model(
    model: str,
    registry: AgentRegistry,
    *,
    trusted: bool = False,
    settings: LlmSettings | None = None,
    cache: AdapterCache | None = None,
) -> LlmAdapter:
    """The adapter for ``model``.

    ``trusted``: the string is the run's agent's own model, not one named for the run.
    ``settings``: read from the environment (:meth:`LlmSettings.from_env`) if None.
    ``cache``: the process's cache (:data:`CACHE`) if None.
    """
    provider, _, name = model.partition(":")
    if not name:
        raise ConfigError(f"model {model!r} must look like PROVIDER:MODEL")
    settings = LlmSettings.from_env() if settings is None else settings
    cache = CACHE if cache is None else cache
    if provider != SCRIPTED:
        # Here, not at the top: the providers' adapters load httpx, which a worker whose agents
        # all run scripted (or their own) models does not need in its memory.
        from shared.llm.providers import build_adapter

        return cache.get((model, settings), lambda: build_adapter(model, settings=settings.http()))
    registered = registry.model(name)
    if registered is not None:
        return registered
    if not name.endswith(".json"):
        raise ConfigError(
            f"scripted model {name!r} is neither registered in the agents module nor a .json file"
        )
    path = script_path(name, trusted=trusted or is_agents_model(model, registry), settings=settings)
    return cache.get((model, path), lambda: ScriptedModel(load_script(path)))


def is_agents_model(model: str, registry: AgentRegistry) -> bool:
    """Whether ``model`` is, exactly as written, the model of an agent of ``registry``."""
    return any(registry.get(name).model == model for name in registry.names)


def script_path(name: str, *, trusted: bool, settings: LlmSettings) -> str:
    """The file a ``scripted:NAME.json`` model may be read from, or ConfigError saying why not.

    Decided from the name and the settings alone: a refused file is never opened.
    """
    if trusted:
        return name
    directory = settings.scripts_dir
    if directory is None:
        raise ConfigError(
            f"scripted model file {name!r} was not read: a run may name a model file only as its "
            f"agent's own model. Register the model in the agents module (registry.add_model) and "
            f"name it scripted:NAME, or set {ENV_SCRIPTS_DIR} on the workers to the directory runs "
            f"may read model files from"
        )
    root = directory.resolve()
    resolved = (root / name).resolve()
    if not resolved.is_relative_to(root):
        raise ConfigError(
            f"scripted model file {name!r} was not read: it is outside {ENV_SCRIPTS_DIR}. "
            f"Put it in that directory and name it relative to it, or register the model in the "
            f"agents module (registry.add_model)"
        )
    return str(resolved)
