"""Fault injection for the chaos tests, enabled only by environment variables.

``WESICHAIN_FAULT`` is a comma-separated list of fault points:

* ``crash_after_commit:<phase>`` — SIGKILL the process right after a ``<phase>`` task committed
  and before it published the next phase (once per run, so recovery can succeed);
* ``pause:<phase>`` — after claiming a ``<phase>`` task, record this process's pid under
  ``<prefix>fault:pid:<phase>:<run_id>`` and sleep ``WESICHAIN_FAULT_PAUSE_S`` seconds (once
  per run), so a test can kill the process in the middle of that phase;
* ``duplicate_publish`` — publish every task twice.

Phases are ``idle`` (start), ``thinking``, ``acting`` (tool) and ``observing``. Unset (always,
in production), every function here is a no-op.
"""

from __future__ import annotations

import os
import signal
import time

from shared.store import RunStore

_FAULTS = frozenset(f for f in os.environ.get("WESICHAIN_FAULT", "").split(",") if f)
_PAUSE_S = float(os.environ.get("WESICHAIN_FAULT_PAUSE_S", "5"))


def enabled(name: str) -> bool:
    return name in _FAULTS


def _once(name: str, store: RunStore, run_id: str) -> bool:
    # The value is the pid the fault fired in, so a test can tell which process it killed.
    return bool(store.redis.set(store.keys.fault(name, run_id), str(os.getpid()), nx=True, ex=3600))


def crash_point(name: str, store: RunStore, run_id: str) -> None:
    if name in _FAULTS and _once(name, store, run_id):
        os.kill(os.getpid(), signal.SIGKILL)


def pause_point(phase: str, store: RunStore, run_id: str) -> None:
    name = f"pause:{phase}"
    if name in _FAULTS and _once(name, store, run_id):
        store.redis.set(store.keys.fault_pid(phase, run_id), str(os.getpid()), ex=3600)
        time.sleep(_PAUSE_S)
