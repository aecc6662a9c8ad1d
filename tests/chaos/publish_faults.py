"""The chaos suite's faults, and one more beside a standalone Redis broker: a crash right after the
publish that follows a commit.

``WESICHAIN_HOOKS=tests.chaos.publish_faults:PublishFaults`` with ``WESICHAIN_FAULT`` naming
``crash_after_publish:<phase>`` SIGKILLs the process right after the broker took the transaction
that publishes what a ``<phase>`` commit leads to and acknowledges the committing delivery
(``Runtime.publish``, ``worker/acks.py``), once per run, recorded under
:func:`~worker.testing.faults.fired_key`. Every other fault of :class:`ChaosHooks` works as there.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Sequence
from typing import Any

import worker.app
from producer.publishing import publish_commands
from shared.state import Phase, RunHead
from shared.store import BrokerCommand, RunStore
from worker.testing.faults import ChaosHooks, fired_key

__all__ = ["PublishFaults"]


class _Armed(threading.local):
    """The crash a commit of this thread armed: (fault name, run id, store), or None."""

    crash: tuple[str, str, RunStore] | None = None


_armed = _Armed()


def _publish_then_crash(client: Any, commands: Sequence[BrokerCommand], atomic: bool = False) -> None:
    armed, _armed.crash = _armed.crash, None
    publish_commands(client, commands, atomic)
    # Only the transaction that carries the delivery's acknowledgement is the publish after a
    # commit (a sweeper's or a plain send is not).
    if armed is not None and atomic:
        name, run_id, store = armed
        if store.redis.set(fired_key(name, run_id), str(os.getpid()), nx=True, ex=3600):
            os.kill(os.getpid(), signal.SIGKILL)


class PublishFaults(ChaosHooks):
    def __init__(self) -> None:
        super().__init__()
        # The runtime's publishers look the function up in their module each time they publish.
        setattr(worker.app, "publish_commands", _publish_then_crash)  # noqa: B010 (not exported)

    def after_commit(self, phase: Phase, committed: RunHead, store: RunStore) -> None:
        super().after_commit(phase, committed, store)
        name = f"crash_after_publish:{phase.value}"
        if name in self.faults:
            _armed.crash = (name, committed.run_id, store)
