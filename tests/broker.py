"""The broker a test session runs against: the run state's Redis (the default) or RabbitMQ.

``pytest --broker rabbitmq`` runs the integration and chaos suites with RabbitMQ as the broker
(127.0.0.1:5672, guest/guest; the run state stays in the tests' own redis-server). The session
creates a virtual host of its own with ``rabbitmqctl`` and deletes it at the end; the chaos suite
gives every test a virtual host of its own, as it gives each its own redis-server. The broker URL
travels in ``WESICHAIN_BROKER_URL``: worker subprocesses inherit it, and :class:`Settings` (the
runtime's settings, as the tests build them) reads it as its default.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from shared.settings import ENV_BROKER_URL
from shared.settings import Settings as RuntimeSettings

__all__ = ["RABBITMQ", "Settings", "rabbitmq_available", "session_broker_url", "vhost"]

#: The RabbitMQ server of the machine (its default guest user only connects from loopback).
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672"


def session_broker_url() -> str:
    """The broker of this test session (empty: the run state's Redis)."""
    return os.environ.get(ENV_BROKER_URL, "")


@dataclass(frozen=True)
class Settings(RuntimeSettings):
    """The runtime's settings, on the broker this test session runs against."""

    broker_url: str = field(default_factory=session_broker_url, repr=False)


def _ctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


def rabbitmq_available() -> bool:
    if shutil.which("rabbitmqctl") is None:
        return False
    try:
        _ctl("list_vhosts")
    except (subprocess.SubprocessError, OSError):
        return False
    return True


@contextmanager
def vhost(name: str = "") -> Iterator[str]:
    """A new RabbitMQ virtual host (guest may do anything in it), deleted afterwards; yields its URL."""
    name = name or f"wesichain-test-{uuid.uuid4().hex[:12]}"
    _ctl("add_vhost", name)
    try:
        _ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        yield f"{RABBITMQ}/{name}"
    finally:
        _ctl("delete_vhost", name)
