"""A publish that failed after its commit: the outbox is marked unsent, so the sweeper sends it.

A run's next tasks are committed to its outbox before they are published, so a publish the broker
refuses (it is restarting, unreachable, or refused the connection) loses nothing; but the sweeper
would find out only by asking the broker for the tasks, and a broker that cannot be searched
(RabbitMQ) gets the whole backlog allowance first (``queued_lease_s`` doubling six times: about 22
minutes with the defaults). Marking the outbox unsent has the sweeper publish it again at its next
look once ``UNSENT_RETRY_S`` has passed, and again after every publish that fails, until one goes
through; a retry is not counted as a lost message (``shared/lua/unsent.lua``). What a failed
publish raises is :data:`producer.publishing.PUBLISH_ERRORS` (kombu's, which ``shared`` does not import).
"""

from __future__ import annotations

import logging

import redis

from shared.state import TaskSpec
from shared.store import RunStore

__all__ = ["UNSENT_RETRY_S", "mark_unsent"]

log = logging.getLogger("wesichain.publish")

#: How long the sweeper waits before publishing an unsent outbox again.
UNSENT_RETRY_S = 2.0


def mark_unsent(store: RunStore, task: TaskSpec, error: Exception, delay_s: float = UNSENT_RETRY_S) -> bool:
    """Mark the outbox ``task`` came from as unsent; True if marked. Never raises: when the run's
    Redis fails too, the sweeper's slower path (asking the broker) still covers the task."""
    run_id, version, epoch = (task.arguments.get(k) for k in ("run_id", "version", "epoch"))
    if not isinstance(run_id, str) or not isinstance(version, int):
        return False
    try:
        marked = store.mark_unsent(run_id, version, epoch if isinstance(epoch, int) else 0, delay_s)
    except redis.RedisError as exc:
        log.warning(
            "run %s: publishing %s failed (%s); marking it unsent failed: %s", run_id, task.name, error, exc
        )
        return False
    if marked:
        log.warning(
            "run %s: publishing %s failed (%s); it stays in the outbox, for a sweeper to send in %.0f s",
            run_id,
            task.name,
            error,
            delay_s,
        )
    return marked
