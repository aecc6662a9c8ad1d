"""``wesichain scheduler``: the process that fires the schedules' due ticks.

Any number may run, on any hosts: each pass reads the due set by Redis's time and fires what is
due through ``client.schedules.fire_due``, whose compare-and-sets and idempotent submits make each
tick start one run however many schedulers race on it (``shared/schedules.py``). One is enough;
two or more are for availability. It needs the run state's Redis and the broker, no agent code.

While Redis is unreachable it waits and tries again; the ticks that fell due meanwhile are fired
then, as each schedule's missed policy says.
"""

from __future__ import annotations

import logging
import threading

import redis

from producer.client import Client
from producer.publishing import PUBLISH_ERRORS
from shared.schedules import redis_now

__all__ = ["DEFAULT_INTERVAL_S", "Scheduler"]

log = logging.getLogger("wesichain.scheduler")

#: How often a scheduler looks for due ticks: a tick starts at most this late (plus the submit).
DEFAULT_INTERVAL_S = 0.25
#: The longest wait between tries while Redis is unreachable.
_MAX_BACK_OFF_S = 2.0


class Scheduler:
    """Fires due ticks, a pass every ``interval_s``, until :meth:`stop`."""

    def __init__(self, client: Client, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.client = client
        self.interval_s = interval_s
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        back_off = self.interval_s
        while not self._stopped.is_set():
            try:
                self.pass_once()
                back_off = self.interval_s
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                log.warning("scheduler: Redis unreachable (%s); trying again", type(exc).__name__)
                back_off = min(back_off * 2, _MAX_BACK_OFF_S)
            except redis.exceptions.RedisError as exc:  # loading after a restart, read-only replica...
                log.warning("scheduler: Redis refused (%s); trying again", str(exc)[:200])
                back_off = min(back_off * 2, _MAX_BACK_OFF_S)
            self._stopped.wait(back_off)

    def pass_once(self) -> int:
        """Fire every due tick once; how many ticks were handled. A schedule whose tick fails for
        another reason than Redis (the broker, a full store) is left due and the others go on."""
        schedules = self.client.schedules
        now = int(redis_now(schedules.store.redis))
        handled = 0
        for tenant, schedule_id in schedules.store.due(now):
            if self._stopped.is_set():
                break
            try:
                handled += schedules.fire_due(tenant, schedule_id)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                raise
            except PUBLISH_ERRORS as exc:
                log.warning(
                    "schedule %s: broker refused (%s); tick left due", schedule_id, type(exc).__name__
                )
            except Exception:
                log.exception("schedule %s: tick failed; left due", schedule_id)
        return handled
