"""Waiting out a full Redis.

With ``maxmemory-policy noeviction``, a Redis at ``maxmemory`` refuses every command that could add
data (``OutOfMemoryError``) and serves the rest. A phase that did its work while Redis was full
(a tool that ran, a model that answered) holds a result nothing else has: failing its task would
throw that away, and for a non-retry-safe tool turn a call that ran once into an outcome unknown.
So the writes of a task (its claim, its commit, its tool result) wait for room instead, under the
claim, which the heartbeat keeps renewing meanwhile (its renewal is written so that a full Redis
accepts it: ``shared/lua/renew.lua``); the task then goes on within a retry interval of memory
being freed. The wait is bounded, so a Redis that stays full for good ends the task as any other
Redis failure does.

While it waits, Redis may also go away and come back: an operator restarts the full server (with
more memory, or after freeing some), or it crashes and restarts from its AOF. The wait goes on
through that too, the same deadline bounding it: a refused write had no effect, and a write whose
reply a lost connection swallowed is safe to send again (each script recognises its own replay, as
for redis-py's own reconnect retries), whereas ending the task would throw away the result it holds
and leave a non-retry-safe tool that ran once with an unknown outcome. The claim is kept through a
restart shorter than its lease (the heartbeat renews it once Redis answers); after a longer one the
sweeper may hand it on first, and the write that comes late is fenced off. A Redis unreachable before any
refusal is not waited for here: that is an outage, whose claims the lease hands on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis

__all__ = ["FULL_WAIT_S", "RETRY_S", "until_room"]

log = logging.getLogger("wesichain.worker")

T = TypeVar("T")

#: How long a task waits for a full Redis before it fails as on any Redis error.
FULL_WAIT_S = 600.0
#: The longest pause between two tries: a run resumes at most this long after memory is freed.
RETRY_S = 0.5


def until_room(write: Callable[[], T], what: str, wait_s: float = FULL_WAIT_S) -> T:
    """Run ``write``; while Redis refuses it for want of memory, try again, up to ``wait_s``.

    A refused command had no effect (Redis checks memory before it runs a command, and a script
    before its first write), so trying it again is safe. Once refused, a lost connection (Redis
    restarted meanwhile) is waited out too, within the same ``wait_s``.
    """
    deadline = time.monotonic() + wait_s
    pause = 0.05
    refused = away = False
    while True:
        try:
            return write()
        except redis.exceptions.OutOfMemoryError as exc:
            if time.monotonic() + pause > deadline:
                raise
            if not refused:
                log.warning("Redis is full: %s waits for memory to be freed (%s)", what, exc)
                refused = True
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            if not refused or time.monotonic() + pause > deadline:
                raise
            if not away:
                log.warning("Redis went away while %s waited for memory: it waits for it (%s)", what, exc)
                away = True
        time.sleep(pause)
        pause = min(pause * 2, RETRY_S)
