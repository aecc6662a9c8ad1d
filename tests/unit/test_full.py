"""``until_room``: a write a full Redis refuses waits for room, and, once refused, for Redis to come
back when it goes away meanwhile (a restart); a Redis unreachable from the first try is not waited
for."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from worker.full import until_room

OOM = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'")
GONE = redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")


def _replies(*outcomes: Exception | str) -> tuple[Callable[[], str], list[int]]:
    """A write that raises or returns each outcome in turn, and the count of its tries."""
    it: Iterator[Exception | str] = iter(outcomes)
    tries = [0]

    def write() -> str:
        tries[0] += 1
        outcome = next(it)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return write, tries


def test_a_write_refused_then_cut_off_by_a_restart_is_sent_until_it_is_taken() -> None:
    write, tries = _replies(OOM, OOM, GONE, redis.exceptions.TimeoutError("timed out"), GONE, "recorded")
    assert until_room(write, "the result") == "recorded"
    assert tries == [6]


def test_a_redis_unreachable_before_any_refusal_is_not_waited_for() -> None:
    write, tries = _replies(GONE, "recorded")
    with pytest.raises(redis.exceptions.ConnectionError):
        until_room(write, "the result")
    assert tries == [1]


def test_the_wait_is_bounded_whatever_ends_it() -> None:
    write, _ = _replies(OOM, *[GONE] * 100)
    with pytest.raises(redis.exceptions.ConnectionError):
        until_room(write, "the result", wait_s=0.2)
    write, _ = _replies(*[OOM] * 100)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        until_room(write, "the result", wait_s=0.2)
