"""Enforcing a tool's ``timeout_s``, softly and then hard.

Soft: in a prefork child (or the solo pool) the tool runs on the main thread, where a SIGALRM
timer raises :class:`ToolTimeout` in the middle of its Python code. ``ToolTimeout`` is a
``BaseException``, so a tool's ``except Exception`` does not swallow it by accident. On a thread
pool no thread can be stopped from outside: the tool runs on a helper thread, the task stops
waiting at the deadline and the call times out, while the abandoned thread runs on until it
returns (tools that can hang belong on the prefork tools queue).

Hard: a tool that catches ``BaseException`` or sits in C code, where no signal handler runs, is
killed with its process by Celery's hard time limit, :func:`hard_limit_s` of its timeout, set on
each tool task; its claim stops being renewed past the same limit.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

__all__ = ["ToolTimeout", "call_with_timeout", "hard_limit_s"]

T = TypeVar("T")


class ToolTimeout(BaseException):
    """The tool ran past its timeout (a BaseException: a tool cannot catch it by accident)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(timeout_s)
        self.timeout_s = timeout_s

    def __str__(self) -> str:
        return f"the tool did not finish within its timeout of {self.timeout_s:g}s"


def hard_limit_s(timeout_s: float) -> float:
    """When a tool's process is killed: its timeout plus a grace for the soft limit to work."""
    return timeout_s + max(5.0, 0.5 * timeout_s)


def call_with_timeout(fn: Callable[[], T], timeout_s: float) -> T:
    if threading.current_thread() is threading.main_thread():
        return _with_alarm(fn, timeout_s)
    return _with_thread(fn, timeout_s)


def _with_alarm(fn: Callable[[], T], timeout_s: float) -> T:
    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise ToolTimeout(timeout_s)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _with_thread(fn: Callable[[], T], timeout_s: float) -> T:
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # handed back to the caller below
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="wesichain-tool", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise ToolTimeout(timeout_s)
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
