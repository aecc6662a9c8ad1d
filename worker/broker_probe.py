"""Asking the broker whether a task's message is still there: how the sweeper tells a phase that
is only waiting in a queue from one whose message was lost.

A committed phase that nobody has claimed yet is either waiting behind a backlog (nothing to do)
or its message is gone (a crash between commit and publish, a message lost between the broker
and a worker): only the broker can tell. For Celery's Redis transport the answer is in its keys:
the queue lists (one per priority step) and the ``unacked`` hash of delivered, unacknowledged
messages (ETA tasks held by a worker included). They are scanned in chunks, inside Redis, for the
ids looked for; the lists are read before the hash, so a message that moves from a list to the
hash during a scan is still seen.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any, Protocol

import redis

from shared.scripts import register_scripts

_ID = re.compile(r'"id": "([^"]*)"')
#: Messages read per round trip: one scan call never blocks Redis for long.
CHUNK = 500


class BrokerProbe(Protocol):
    def present(self, task_ids: Collection[str]) -> set[str] | None:
        """The ids among ``task_ids`` whose messages the broker still holds; None: it cannot tell."""


class UnknownBroker:
    """A broker this probe cannot look into (the in-memory one of the embedded mode): no answer."""

    def present(self, task_ids: Collection[str]) -> set[str] | None:
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
        self.lists = [
            prefix + q if step == 0 else f"{prefix}{q}{sep}{step}" for q in queues for step in priority_steps
        ]
        self.unacked = prefix + "unacked"
        self._scan = register_scripts(client)["scan_queue"]

    def present(self, task_ids: Collection[str]) -> set[str] | None:
        wanted = set(task_ids)
        found: set[str] = set()
        for key in self.lists:
            start = 0
            while wanted - found:
                read, ids = self._scan(keys=[key], args=[start, CHUNK, *sorted(wanted - found)])
                found.update(_text(i) for i in ids)
                if int(read) < CHUNK:
                    break
                start += int(read)
        cursor: Any = 0
        while wanted - found:
            reply: Any = self.client.hscan(self.unacked, cursor, count=CHUNK)
            cursor, entries = reply
            for raw in entries.values():
                match = _ID.search(_text(raw))
                if match and match.group(1) in wanted:
                    found.add(match.group(1))
            if int(cursor) == 0:
                break
        return found


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
