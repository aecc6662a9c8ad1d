"""Enforcing a tool's ``timeout_s``.

In a prefork child (or the solo pool) the tool runs on the main thread, where a SIGALRM timer
interrupts it in the middle of Python code, as Celery's soft time limit does. On a thread pool
there is no way to stop a thread from outside: the tool runs on a helper thread, the task stops
waiting at the deadline and the result is a timeout error, while the abandoned thread runs on
until it returns. Tools that can hang belong on the prefork tools queue.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

T = TypeVar("T")


class ToolTimeout(Exception):
    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the tool did not finish within its timeout of {timeout_s:g}s")


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
