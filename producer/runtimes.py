"""The embedded runtime, for the commands that run in this process when there is no server
(``wesichain eval run --embedded``, ``wesichain pipeline run --embedded``).

The runtime is the worker's (``worker.embedded``): it is found through the
``wesichain.runtimes`` entry point group, as the worker's commands are through
``wesichain.commands``, so the producer never imports worker code.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from shared.errors import ConfigError

if TYPE_CHECKING:
    from producer.client import Client

__all__ = ["GROUP", "Embedded", "embedded_runtime", "run_embedded"]

GROUP = "wesichain.runtimes"

#: ``embedded(agents_module, *, concurrency, archive, **settings)``: a client bound to a worker
#: running in this process, for the ``with`` block.
Embedded = Callable[..., AbstractContextManager["Client"]]


def embedded_runtime() -> Embedded:
    """The installed embedded runtime (``worker.embedded.embedded``)."""
    for entry in entry_points(group=GROUP, name="embedded"):
        runtime: Embedded = entry.load()
        return runtime
    raise ConfigError(
        f"no embedded runtime is installed (entry point {GROUP}:embedded); reinstall wesichain"
        " (pip install wesichain) or give a Redis URL and run workers"
    )


def run_embedded(agents_module: str | None, **options: Any) -> AbstractContextManager[Client]:
    """A client bound to a worker in this process (the in-memory broker, the Redis stand-in)."""
    return embedded_runtime()(agents_module, **options)
