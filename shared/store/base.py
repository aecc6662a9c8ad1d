"""What every part of the run store shares: the Redis client, keys, settings and scripts.

:class:`StoreCore` holds them (and the archive, opened on first use); the parts of
:class:`~shared.store.RunStore` (``runs``, ``claims``, ``listing``, ``sweeping``, ``decisions``,
``events``) are mixins over it, so they share one client, one script registry and one message
cache, and every method is still called on the one store.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis

from shared.errors import ArchiveUnavailable, InternalInvariant
from shared.keys import Keys
from shared.messages import Message
from shared.scripts import Script, ScriptConnections, ScriptSpec, register_scripts, script_connections
from shared.settings import Settings
from shared.state import TaskSpec

if TYPE_CHECKING:
    # The archive's code (SQL, sqlite3, the database drivers) loads when an archive is opened:
    # a worker or client without one never needs it.
    from shared.archive import Archive

__all__ = [
    "ACK_COMMANDS",
    "PUBLISH_COMMANDS",
    "BrokerCommand",
    "MessageCache",
    "StoreCore",
    "new_op",
    "new_token",
]


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def new_token() -> str:
    """A claim's token: 16 random hex digits."""
    return os.urandom(8).hex()


def new_op() -> str:
    """A write's op id (replays recognise it): 32 random hex digits, as a UUID's hex without the
    cost of building one."""
    return os.urandom(16).hex()


class StoreCore:
    """The state every part of the store works on (see :class:`~shared.store.RunStore`)."""

    def __init__(self, client: redis.Redis, settings: Settings, archive: Archive | None = None) -> None:
        self.redis = client
        self.settings = settings
        self.keys = Keys(settings.prefix, settings.shards)
        self._connections = script_connections(client)
        self._scripts = register_scripts(client, self._connections)
        self._messages = MessageCache()
        self._archive = archive
        self._archive_lock = threading.Lock()
        #: When the last open of the archive failed (monotonic seconds), and why.
        self._archive_failed: tuple[float, str] | None = None

    @property
    def connections(self) -> ScriptConnections | None:
        """The kept connections the store's scripts go on: a feature's store on the same client
        (``shared/pipeline/store.py``) sends its scripts on them too."""
        return self._connections

    @property
    def archive(self) -> Archive | None:
        """The archive finished runs move to (opened on first use, once per process), if any."""
        if self._archive is None and self.settings.archive_url:
            asked = time.monotonic()
            with self._archive_lock:
                if self._archive is None:
                    from shared.archive import open_archive

                    failed = self._archive_failed
                    if failed is not None and failed[0] >= asked:
                        # The open this call waited for failed after it asked: that is its answer
                        # too. Each call trying again in turn made a burst of reads during an
                        # outage wait one open's timeout each, one after another, and took every
                        # worker thread of an API process for minutes.
                        raise ArchiveUnavailable(failed[1])
                    try:
                        self._archive = open_archive(self.settings.archive_url)
                    except ArchiveUnavailable as exc:
                        self._archive_failed = (time.monotonic(), str(exc))
                        raise
        return self._archive

    def close_archive(self) -> None:
        """Close the archive's connections, if it was opened (it opens again on next use)."""
        with self._archive_lock:
            archive, self._archive = self._archive, None
        if archive is not None:
            archive.close()

    def _in_redis(self, run_id: str) -> bool:
        return bool(self.redis.exists(self.keys.run(run_id)))

    def _archived(self, run_id: str) -> Archive | None:
        """The archive, when it is the place to read ``run_id`` from (the run is gone from Redis)."""
        archive = self.archive
        if archive is None or self._in_redis(run_id):
            return None
        return archive

    def register_script(self, name: str, source: str, spec: ScriptSpec) -> Script:
        """A script of the store's client built around its own (``spec``: what it takes), sent on
        the same kept connections as the store's scripts."""
        return Script(name, self.redis.register_script(source), self._connections, spec)

    def script(self, name: str) -> Script:
        """One of the store's scripts, for a caller that sends it on a client of its own (the
        API's event loop: ``shared.scripts.run_async``)."""
        return self._scripts[name]

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return self._scripts[name](keys=list(keys), args=[str(a) for a in args])

    @property
    def _lease_ms(self) -> int:
        return int(self.settings.lease_s * 1000)

    @property
    def _queued_ms(self) -> int:
        return int(self.settings.queued_lease_s * 1000)


class MessageCache:
    """Validated conversations of recently seen runs, per process.

    A run's message list is append-only, so a think only needs the messages added since this
    process last saw the run: the Redis read and the validation then stay flat in the run's length.
    """

    def __init__(self, max_runs: int = 128) -> None:
        self.max_runs = max_runs
        self._runs: OrderedDict[str, list[Message]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, run_id: str) -> list[Message] | None:
        with self._lock:
            messages = self._runs.get(run_id)
            if messages is not None:
                self._runs.move_to_end(run_id)
            return messages

    def put(self, run_id: str, messages: list[Message]) -> None:
        with self._lock:
            self._runs[run_id] = messages
            self._runs.move_to_end(run_id)
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)


#: One Redis command of a task's publish to a Redis broker, as kombu would run it: its name and
#: arguments (see ``producer/publishing.py``).
BrokerCommand = tuple[str, tuple[str, ...]]

#: The commands a create or commit script runs for a publish (it refuses any other).
PUBLISH_COMMANDS = frozenset({"lpush", "publish", "pexpire"})

#: The commands a commit script runs, beside a publish, to acknowledge the Redis broker's message the
#: committing delivery came from (kombu's ack: ``worker/acks.py``).
ACK_COMMANDS = frozenset({"hdel", "zrem"})


def _push_args(epoch: int, push: Sequence[BrokerCommand]) -> list[str]:
    """Broker commands as script arguments: the epoch they were built for, their count, then name,
    argument count and arguments of each."""
    flat = [str(epoch), str(len(push))]
    for name, args in push:
        if name not in PUBLISH_COMMANDS and name not in ACK_COMMANDS:
            raise InternalInvariant(f"broker command {name!r} is not one a script may run")
        flat += [name, str(len(args)), *args]
    return flat


def _dump_outbox(outbox: Sequence[TaskSpec]) -> str:
    return "[" + ",".join(t.model_dump_json() for t in outbox) + "]"


def _load_outbox(raw: str) -> list[TaskSpec]:
    value = json.loads(raw)
    return [TaskSpec.model_validate(t) for t in value] if isinstance(value, list) else []
