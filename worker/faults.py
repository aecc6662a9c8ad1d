"""Fault injection for the chaos tests, enabled only by an environment variable.

``WESICHAIN_FAULT=crash_after_commit:think`` SIGKILLs the worker process right after a think
phase committed and before it published the next phase — once per run, so the test can watch the
run recover. Unset (always, in production), every function here is a no-op.
"""

from __future__ import annotations

import os
import signal

from shared.store import RunStore

_FAULTS = frozenset(f for f in os.environ.get("WESICHAIN_FAULT", "").split(",") if f)


def enabled(name: str) -> bool:
    return name in _FAULTS


def crash_point(name: str, store: RunStore, run_id: str) -> None:
    if name not in _FAULTS:
        return
    # Fire once per run: the recovery that follows must be allowed to succeed.
    if store.redis.set(f"{store.keys.prefix}fault:{name}:{run_id}", "1", nx=True, ex=3600):
        os.kill(os.getpid(), signal.SIGKILL)
