"""A claim's cancel and lost flags: set by the heartbeat thread, checked and waited on by the phase."""

from __future__ import annotations

import threading
import time

from worker.heartbeat import Flag, Held


def test_a_flag_starts_clear_and_stays_set() -> None:
    flag = Flag()
    assert not flag.is_set()
    assert flag.wait(0) is False
    flag.set()
    assert flag.is_set()
    assert flag.wait(0) is True
    assert flag.wait(None) is True  # set: no wait at all


def test_a_wait_times_out_when_nothing_sets_the_flag() -> None:
    flag = Flag()
    started = time.monotonic()
    assert flag.wait(0.05) is False
    assert time.monotonic() - started >= 0.05


def test_a_set_from_another_thread_ends_a_wait() -> None:
    flag = Flag()
    waiting = threading.Event()
    woke: list[bool] = []

    def waiter() -> None:
        waiting.set()
        woke.append(flag.wait(60))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert waiting.wait(10)
    flag.set()
    thread.join(30)
    assert not thread.is_alive() and woke == [True]


def test_a_set_racing_the_first_wait_is_never_missed() -> None:
    """Whichever of set and the first wait comes first, the waiter sees the flag set."""
    for _ in range(200):
        flag = Flag()
        woke: list[bool] = []
        thread = threading.Thread(target=lambda f=flag, w=woke: w.append(f.wait(30)))
        thread.start()
        flag.set()
        thread.join(30)
        assert woke == [True]


def test_each_held_claim_has_its_own_flags() -> None:
    a, b = Held("r", "running", "t1"), Held("r", "running", "t2")
    a.cancelled.set()
    assert a.cancelled.is_set() and not b.cancelled.is_set()
    assert not a.lost.is_set()
