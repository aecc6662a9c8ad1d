"""The suite's real processes: :mod:`worker.testing`'s redis-server and workers, on the broker this
test session gives each server (``tests/broker.py``), the workers serving the suite's agents
(``tests.agents_fixture``) unless told others."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from shared.store import RunStore

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
    "wait_thread_free",
    "wait_until",
]

#: The agents module the suite's workers serve when a test names none.
AGENTS = "tests.agents_fixture"


class WorkerProcess(harness.WorkerProcess):
    def __init__(self, name: str, redis_url: str, *, agents: str = AGENTS, **options: Any) -> None:
        super().__init__(name, redis_url, agents=agents, **options)


def wait_thread_free(store: RunStore, thread: str, timeout: float, tenant: str | None = None) -> None:
    """Wait until no run holds ``thread``. A run hands its thread on in a step after its terminal
    commit (the thread's keys are on another slot), so a caller that saw the run end may look
    before the thread is released."""
    wait_until(
        lambda: store.thread_holder(tenant, thread)[0] == "",
        timeout,
        what=f"thread {thread} to be handed on by its last run",
    )
