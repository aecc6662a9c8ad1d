"""The chaos suite's fault injection (:mod:`worker.testing.faults`), under the name its tests give
workers (``WESICHAIN_HOOKS=tests.chaos.faults:ChaosHooks``)."""

from __future__ import annotations

from worker.testing.faults import PREFIX, ChaosHooks, fired_key, pid_key

__all__ = ["PREFIX", "ChaosHooks", "fired_key", "pid_key"]
