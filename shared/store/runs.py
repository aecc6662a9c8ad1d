"""A run's own state: creating it, and reading its head, conversation, results and checkpoints.

Every read of a run that is no longer in Redis is answered from the archive (when there is one),
in the same types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis

from shared import protocol
from shared.errors import InternalInvariant
from shared.messages import MESSAGE_ADAPTER, Message
from shared.scripts import run_many
from shared.search_index import index_dimensions
from shared.state import Phase, RunHead, TaskSpec, ToolResult
from shared.store.base import BrokerCommand, StoreCore, _dump_outbox, _push_args, _s, new_op

__all__ = [
    "Creation",
    "NewRun",
    "Release",
    "RunsMixin",
    "creation_of",
    "loaded_head",
]


@dataclass(frozen=True)
class Release:
    """A member of a sorted set that creating a run removes in the same step: a producer's hold of
    the run's place under a limit (``producer/api/limits.py``), given up the moment the run counts."""

    key: str
    member: str


#: What creating a run did: created it and ran the publish of its start (``pushed``), created it
#: (the caller publishes), or found a run with its id already there.
Creation = Literal["pushed", "created", "exists"]


@dataclass(frozen=True)
class NewRun:
    """A run to create (:meth:`RunsMixin.create_many`): its head, its outbox, the broker commands
    that publish its start with the create, and the hold the create gives up (see
    :meth:`RunsMixin.create_run`)."""

    head: RunHead
    outbox: Sequence[TaskSpec]
    push: Sequence[BrokerCommand] = ()
    release: Release | None = None


def creation_of(reply: Any) -> Creation:
    """What creating a run did, from the create script's reply."""
    if _s(reply[0]) != "created":
        return "exists"
    return "pushed" if _s(reply[1]) == "1" else "created"


def loaded_head(raw: Sequence[Any]) -> RunHead | None:
    """The head from the reply of a run's ``HMGET body request epoch``; None for a run not in Redis."""
    if raw[0] is None:
        return None
    return RunHead.compose(_s(raw[0]), _s(raw[1]), int(raw[2] or 0))


class RunsMixin(StoreCore):
    """Creating a run and reading it."""

    # -- reading ---------------------------------------------------------------------------

    def load(self, run_id: str) -> RunHead | None:
        head = self._load_redis(run_id)
        if head is None and (archive := self.archive) is not None:
            return archive.load(run_id)
        return head

    def phase_of(self, run_id: str) -> Phase | None:
        """The run's phase as Redis holds it (None: not in Redis), without reading its head: for a
        sweep over many runs that needs no more (a head holds its whole conversation)."""
        raw = self.redis.hget(self.keys.run(run_id), protocol.PHASE)
        return None if raw is None else Phase(_s(raw))

    def _load_redis(self, run_id: str) -> RunHead | None:
        raw = self.redis.hmget(self.keys.run(run_id), protocol.BODY, protocol.REQUEST, protocol.EPOCH)
        return loaded_head(raw)

    def queue_load(self, pipe: Any, run_id: str) -> None:
        """Queue the read of :meth:`load` on the pipeline ``pipe``, to share a round trip with other
        commands; :func:`loaded_head` makes its reply the head (None: not in Redis)."""
        pipe.hmget(self.keys.run(run_id), protocol.BODY, protocol.REQUEST, protocol.EPOCH)

    def load_many(self, run_ids: Sequence[str]) -> list[RunHead | None]:
        """The heads of ``run_ids`` still in Redis, in one pipelined round trip (per node of a
        Redis Cluster); None for each run not there (gone, or archived: the archive is not read)."""
        if not run_ids:
            return []
        fields = (protocol.BODY, protocol.REQUEST, protocol.EPOCH)
        with self.redis.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.hmget(self.keys.run(run_id), *fields)
            replies = pipe.execute()
        return [
            RunHead.compose(_s(raw[0]), _s(raw[1]), int(raw[2] or 0)) if raw[0] is not None else None
            for raw in replies
        ]

    def load_raw(self, run_id: str) -> dict[str, str]:
        raw = self.redis.hgetall(self.keys.run(run_id))
        return {_s(k): _s(v) for k, v in raw.items()}

    def load_messages(self, run_id: str, start: int = 0, end: int = -1) -> list[Message]:
        raw = self.redis.lrange(self.keys.messages(run_id), start, end)
        if not raw and (archive := self._archived(run_id)) is not None:
            return archive.messages(run_id, start, end)
        return [MESSAGE_ADAPTER.validate_json(m) for m in raw]

    def load_results(self, run_id: str, step: int) -> list[ToolResult]:
        raw = self.redis.hvals(self.keys.results(run_id, step))
        if not raw and (archive := self._archived(run_id)) is not None:
            return archive.results(run_id, step)
        return [ToolResult.model_validate_json(r) for r in raw]

    def checkpoints(self, run_id: str, start: int = 0, end: int = -1) -> list[RunHead]:
        """Every committed head, in version order (epochs are not part of a checkpoint: 0).

        ``start`` and ``end`` (inclusive, -1: the last) bound the versions read, as indexes
        (version - 1), so a long run's checkpoints can be read a page at a time.
        """
        request = self.redis.hget(self.keys.run(run_id), protocol.REQUEST)
        if request is None:
            archive = self.archive
            archived = archive.checkpoints(run_id) if archive is not None else []
            return archived[start : None if end == -1 else end + 1]
        bodies = self.redis.lrange(self.keys.checkpoints(run_id), start, end)
        return [RunHead.compose(_s(b), _s(request), 0) for b in bodies]

    def attempts(self, run_id: str) -> dict[str, str]:
        raw = self.redis.hgetall(self.keys.attempts(run_id))
        return {_s(k): _s(v) for k, v in raw.items()}

    def persistence(self) -> str:
        """How durably Redis keeps what it acknowledged (see docs/guarantees.md, "Durability").

        ``aof-always`` (each write on disk before the reply), ``aof-everysec``, ``aof-no``, ``none``
        (no AOF: a restart loses everything since the last snapshot), or ``unknown`` when Redis
        will not say (CONFIG is often renamed away on managed services).
        """
        if self.settings.embedded:
            return "none"
        try:
            config = self.redis.config_get("append*")
        except redis.ResponseError:
            return "unknown"
        if str(config.get("appendonly", "no")) != "yes":
            return "none"
        return f"aof-{config.get('appendfsync', 'everysec')}"

    def cancel_requested(self, run_id: str) -> bool:
        return _s(self.redis.hget(self.keys.run(run_id), protocol.CANCEL) or b"") == "1"

    # -- creating --------------------------------------------------------------------------

    def create(self, head: RunHead, outbox: Sequence[TaskSpec]) -> bool:
        """Create an IDLE run at version 1; False if a run with this id already exists."""
        return self.create_run(head, outbox) != "exists"

    def create_run(
        self,
        head: RunHead,
        outbox: Sequence[TaskSpec],
        push: Sequence[BrokerCommand] = (),
        release: Release | None = None,
    ) -> Creation:
        """Create an IDLE run at version 1, ``exists`` if a run with this id already exists.

        ``push``: the broker commands that publish the run's start task (Redis broker on this
        server only), run by the script with the create: ``pushed`` says they ran, ``created``
        that the caller publishes (none given, or a replay of this very create).
        ``release``: a sorted set's member removed in the same step once the run is created (not
        when it ``exists``); on a standalone Redis only (on a cluster it is in another slot)."""
        (created,) = self.create_many([NewRun(head, outbox, push, release)])
        if isinstance(created, Exception):
            raise created
        return created

    def create_many(self, runs: Sequence[NewRun]) -> list[Creation | Exception]:
        """Create runs as :meth:`create_run` does, in one round trip on a standalone Redis: for
        each, what creating it did, or the error Redis answered for it (an ``OutOfMemoryError``;
        the others were still created)."""
        calls = [self.create_call(run) for run in runs]
        if len(calls) == 1:  # one run: on the thread's own script connection
            keys, args = calls[0]
            try:
                return [creation_of(self._run("create", keys, args))]
            except redis.exceptions.ResponseError as exc:
                return [exc]
        replies = run_many(self.redis, self._scripts["create"], calls, raise_on_error=False)
        return [reply if isinstance(reply, Exception) else creation_of(reply) for reply in replies]

    def create_call(self, run: NewRun) -> tuple[list[str], list[Any]]:
        """The create script's keys and arguments for ``run`` (its reply: :func:`creation_of`), for
        :meth:`create_many` and for a caller that sends the script itself (the API's event loop)."""
        head, release = run.head, run.release
        if head.version != 1 or head.phase is not Phase.IDLE:
            raise InternalInvariant(f"a run is created IDLE at version 1, not {head.phase} v{head.version}")
        k, run_id, tenant = self.keys, head.run_id, head.tenant
        indexes = [
            k.index_of(run_id, tenant, dimension, value)
            for dimension, value in index_dimensions(head, self.settings.search_attributes)
        ]
        keys = [
            k.run(run_id),
            k.checkpoints(run_id),
            k.leases_of(run_id),
            k.runs_index_of(run_id),
            k.indexes_of(run_id),
            k.inflight_of(run_id),
            *indexes,
            *([release.key] if release is not None else []),
        ]
        args = [
            run_id,
            new_op(),
            head.dump_request(),
            head.dump_body(),
            _dump_outbox(run.outbox),
            self._queued_ms,
            tenant or "-",
            release.member if release is not None else "",
            *_push_args(0, run.push),
        ]
        return keys, args
