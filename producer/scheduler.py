"""``wesichain scheduler``: the process that fires the schedules' due ticks.

Any number may run, on any hosts: each pass reads the due set by Redis's time and fires what is
due through ``client.schedules.fire_due``, whose compare-and-sets and idempotent submits make each
tick start one run however many schedulers race on it (``shared/schedules.py``). One is enough;
two or more are for availability. It needs the run state's Redis and the broker, no agent code.

While Redis is unreachable it waits and tries again; the ticks that fell due meanwhile are fired
then, as each schedule's missed policy says.

The same loop runs as a thread of ``wesichain sweeper --schedules`` (or with
``WESICHAIN_SWEEPER_SCHEDULES=1``), for operators who run a sweeper already; it is as safe there,
beside any number of other schedulers.

``Settings.hooks`` may name a :class:`~producer.schedules.SchedulerHooks` subclass (the worker's
hooks class may be one too): the loop calls it at its extension points.
"""

from __future__ import annotations

import importlib
import logging
import threading

import redis

from producer.client import Client
from producer.publishing import PUBLISH_ERRORS
from producer.schedules import SchedulerHooks
from shared.errors import ConfigError
from shared.schedules import redis_now

__all__ = ["DEFAULT_INTERVAL_S", "STARTED", "Scheduler", "load_scheduler_hooks"]

log = logging.getLogger("wesichain.scheduler")

#: How often a scheduler looks for due ticks: a tick starts at most this late (plus the submit).
DEFAULT_INTERVAL_S = 0.25
#: The longest wait between tries while Redis is unreachable.
_MAX_BACK_OFF_S = 2.0
#: The first words a scheduler logs once it runs its passes (its start-up, imports included, is over).
STARTED = "scheduler: started"


class Scheduler:
    """Fires due ticks, a pass every ``interval_s``, until :meth:`stop`."""

    def __init__(self, client: Client, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.client = client
        self.interval_s = interval_s
        self._stopped = threading.Event()
        client.schedules.hooks = load_scheduler_hooks(client.settings.hooks)

    def start_thread(self) -> threading.Thread:
        """Run in a daemon thread of this process (the sweeper's), until :meth:`stop`."""
        thread = threading.Thread(target=self.run, name="wesichain-scheduler", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        log.info("%s: firing due ticks, a pass every %.2f s", STARTED, self.interval_s)
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


def load_scheduler_hooks(path: str) -> SchedulerHooks:
    """The hooks ``module:Class`` names if the class is a :class:`SchedulerHooks` (a worker's
    hooks class that is not one is for the workers alone), else the no-op defaults."""
    if not path:
        return SchedulerHooks()
    module_name, _, class_name = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"cannot load hooks {path!r} (want module:Class): {exc}") from exc
    if isinstance(cls, type) and issubclass(cls, SchedulerHooks):
        hooks: SchedulerHooks = cls()
        return hooks
    return SchedulerHooks()
