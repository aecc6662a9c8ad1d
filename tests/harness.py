"""The suite's real processes: :mod:`worker.testing`'s redis-server and workers, on the broker this
test session gives each server (``tests/broker.py``), the workers serving the suite's agents
(``tests.agents_fixture``) unless told others."""

from __future__ import annotations

from typing import Any

# Imported for its effect too: it installs the session's broker rule (RabbitMQ with --broker rabbitmq).
import tests.broker  # noqa: F401
from worker.testing import harness
from worker.testing.harness import (
    ROOT,
    PortTaken,
    RedisServer,
    ServerTls,
    free_port,
    running,
    start_all,
    stop_all,
    wait_until,
)

__all__ = [
    "ROOT",
    "PortTaken",
    "RedisServer",
    "ServerTls",
    "WorkerProcess",
    "free_port",
    "running",
    "start_all",
    "stop_all",
    "wait_until",
]

#: The agents module the suite's workers serve when a test names none.
AGENTS = "tests.agents_fixture"


class WorkerProcess(harness.WorkerProcess):
    def __init__(self, name: str, redis_url: str, *, agents: str = AGENTS, **options: Any) -> None:
        super().__init__(name, redis_url, agents=agents, **options)
