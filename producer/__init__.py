"""Enqueue and follow runs: Python client, CLI, embedded mode. Never imports worker code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from producer.client import Client, RunHandle, RunTimeout

__all__ = ["Client", "RunHandle", "RunTimeout"]


def __getattr__(name: str) -> Any:
    # The client is imported when first asked for: ``python -m producer.cli worker`` imports this
    # package, and a worker process that never uses the client should not carry its modules.
    if name in __all__:
        from producer import client

        return getattr(client, name)
    raise AttributeError(f"module 'producer' has no attribute {name!r}")
