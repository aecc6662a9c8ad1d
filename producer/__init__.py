"""Enqueue and follow runs: Python client, CLI, embedded mode. Never imports worker code."""

from producer.client import Client, RunHandle, RunTimeout

__all__ = ["Client", "RunHandle", "RunTimeout"]
