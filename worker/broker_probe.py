"""Asking the broker whether a task's message is still there: how the sweeper tells a phase that
is only waiting in a queue from one whose message was lost.

A committed phase that nobody has claimed yet is either waiting behind a backlog (nothing to do)
or its message is gone (a crash between commit and publish, a message lost between the broker
and a worker): only the broker can tell. For Celery's Redis transport the answer is in its keys:
the queue lists (one per priority step) and the ``unacked`` hash of delivered, unacknowledged
messages. They are scanned in chunks, inside Redis, for the ids looked for; the lists are read
before the hash, so a message that moves from a list to the hash during a scan is still seen.

A message in a queue list waits for a consumer. A message in the ``unacked`` hash was handed to a
worker: if that worker lives it claims the run within moments (or at its ETA, a few seconds at
most for a retry's backoff); if it died, the broker gives the message back only after its
visibility timeout, an hour. So the two are told apart (:class:`Located`): the sweeper waits for
a queued message as long as it takes, and for a delivered one only once.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from shared.scripts import register_scripts

__all__ = ["BrokerProbe", "CHUNK", "Located", "RedisQueues", "UnknownBroker"]

_ID = re.compile(r'"id": "([^"]*)"')
#: Messages read per round trip: one scan call never blocks Redis for long.
CHUNK = 500


@dataclass(frozen=True)
class Located:
    """Where the broker holds the messages looked for."""

    #: Waiting in a queue for a consumer.
    queued: frozenset[str]
    #: Handed to a worker and not acknowledged yet.
    delivered: frozenset[str]


class BrokerProbe(Protocol):
    """Where the broker holds given task messages."""

    def locate(self, task_ids: Collection[str], queues: Collection[str] = ()) -> Located | None:
        """Where the broker holds the messages of ``task_ids``, looking in ``queues`` too (those a
        run's queue namespace sent them to) besides the pool's default queues; None: it cannot
        tell."""


class UnknownBroker:
    """A broker this probe cannot look into (the in-memory one of the embedded mode): no answer."""

    def locate(self, task_ids: Collection[str], queues: Collection[str] = ()) -> Located | None:
        return None


class RedisQueues:
    """The queues of Celery's Redis transport."""

    def __init__(
        self,
        client: redis.Redis,
        queues: Sequence[str],
        *,
        prefix: str = "",
        priority_steps: Sequence[int] = (0, 3, 6, 9),
        sep: str = "\x06\x16",
    ) -> None:
        self.client = client
        self.prefix, self.sep, self.priority_steps = prefix, sep, tuple(priority_steps)
        self.queues = list(queues)
        self.lists = self._lists(self.queues)
        self.unacked = prefix + "unacked"
        self._scan = register_scripts(client)["scan_queue"]

    def _lists(self, queues: Sequence[str]) -> list[str]:
        """The Redis lists of ``queues``: one per priority step."""
        p, sep = self.prefix, self.sep
        return [p + q if step == 0 else f"{p}{q}{sep}{step}" for q in queues for step in self.priority_steps]

    def locate(self, task_ids: Collection[str], queues: Collection[str] = ()) -> Located | None:
        wanted = set(task_ids)
        queued: set[str] = set()
        extra = sorted(set(queues) - set(self.queues))
        for key in self.lists + self._lists(extra):
            start = 0
            while wanted - queued:
                read, ids = self._scan(keys=[key], args=[start, CHUNK, *sorted(wanted - queued)])
                queued.update(_text(i) for i in ids)
                if int(read) < CHUNK:
                    break
                start += int(read)
        delivered: set[str] = set()
        cursor: Any = 0
        while wanted - queued - delivered:
            reply: Any = self.client.hscan(self.unacked, cursor, count=CHUNK)
            cursor, entries = reply
            for raw in entries.values():
                match = _ID.search(_text(raw))
                if match and match.group(1) in wanted:
                    delivered.add(match.group(1))
            if int(cursor) == 0:
                break
        return Located(frozenset(queued), frozenset(delivered - queued))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
