"""Fault injection for chaos tests and the recovery benchmark, installed into workers as their hooks.

``WESICHAIN_HOOKS=worker.testing.faults:ChaosHooks`` makes a worker build these; ``WESICHAIN_FAULT`` is
a comma-separated list of fault points:

* ``crash_after_commit:<phase>`` — SIGKILL the process right after a ``<phase>`` task committed
  and before it published the next phase (once per run, so recovery can succeed);
* ``crash_after_commit:ended`` — SIGKILL the process right after the commit that ended a run
  (completed, failed), before anything that follows it: the publish of its callback, the hand-on
  of its thread to the next run (once per run);
* ``pause:<phase>`` — after claiming a ``<phase>`` task, record this process's pid under
  :func:`pid_key` and sleep ``WESICHAIN_FAULT_PAUSE_S`` seconds (once per run), so a test can
  kill the process in the middle of that phase;
* ``duplicate_publish`` — publish every task twice;
* ``lose:<task>`` — drop every message of the task named ``<task>`` (``wesichain.decide``) sent
  under epoch 0, as a broker that lost it before any worker took it would: a sweeper's hand-on,
  which sends it under a new epoch, gets through.
* ``crash_after_tick_submit`` — in a scheduler (``wesichain scheduler``, or a sweeper running the
  schedules), SIGKILL the process right after a tick's run (or pipeline run) was submitted and
  before the schedule was advanced past the tick (once per schedule, recorded under
  :func:`fired_key` with the schedule id).

Phases are ``idle`` (start), ``thinking``, ``acting`` (tool) and ``observing``. Each fault that
fires records the pid it fired in under :func:`fired_key`, so tests can tell which process it hit.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence

from producer.schedules import SchedulerHooks
from shared.schedules import Schedule, ScheduleStore, ScheduleTick
from shared.state import Phase, RunHead, TaskSpec
from shared.store import RunStore
from worker.hooks import Hooks

__all__ = ["PREFIX", "ChaosHooks", "fired_key", "pid_key"]

PREFIX = "test:fault:"


def fired_key(name: str, run_id: str) -> str:
    """String: the pid a fault fired in, for one run (set once)."""
    return f"{PREFIX}{name}:{run_id}"


def pid_key(phase: Phase | str, run_id: str) -> str:
    """String: the pid a ``pause:<phase>`` fault paused in (tests kill it)."""
    return f"{PREFIX}pid:{Phase(phase).value}:{run_id}"


class ChaosHooks(Hooks, SchedulerHooks):
    def __init__(self) -> None:
        self.faults = frozenset(f for f in os.environ.get("WESICHAIN_FAULT", "").split(",") if f)
        self.pause_s = float(os.environ.get("WESICHAIN_FAULT_PAUSE_S", "5"))

    def _once(self, name: str, store: RunStore, run_id: str) -> bool:
        return bool(store.redis.set(fired_key(name, run_id), str(os.getpid()), nx=True, ex=3600))

    def on_claimed(self, phase: Phase, run_id: str, store: RunStore) -> None:
        name = f"pause:{phase.value}"
        if name in self.faults and self._once(name, store, run_id):
            store.redis.set(pid_key(phase, run_id), str(os.getpid()), ex=3600)
            time.sleep(self.pause_s)

    def after_commit(self, phase: Phase, committed: RunHead, store: RunStore) -> None:
        run_id = committed.run_id
        name = f"crash_after_commit:{phase.value}"
        if name in self.faults and self._once(name, store, run_id):
            os.kill(os.getpid(), signal.SIGKILL)
        # The process whose own commit ended the run: not one that committed an earlier phase and
        # reads the run after the next phase (already published) ended it elsewhere.
        ended = "crash_after_commit:ended"
        if ended in self.faults and committed.terminal and self._once(ended, store, run_id):
            os.kill(os.getpid(), signal.SIGKILL)

    def after_tick_submitted(
        self, store: ScheduleStore, schedule: Schedule, tick: int, entry: ScheduleTick
    ) -> None:
        name = "crash_after_tick_submit"
        fired = fired_key(name, schedule.schedule_id)
        if name in self.faults and store.redis.set(fired, f"{os.getpid()}:{tick}", nx=True, ex=3600):
            os.kill(os.getpid(), signal.SIGKILL)

    def outgoing(self, spec: TaskSpec) -> Sequence[TaskSpec]:
        if f"lose:{spec.name}" in self.faults and not spec.arguments.get("epoch"):
            return ()
        return (spec, spec) if "duplicate_publish" in self.faults else (spec,)
