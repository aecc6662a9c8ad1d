"""The run store: Redis keys and the atomic scripts over them.

Every write that matters is one Lua script (``shared/lua``), so Redis sees it whole or not at all:

* :meth:`RunStore.create` — a new run, once per run id;
* :meth:`RunStore.claim_phase` / :meth:`RunStore.claim_call` — check a delivery against the run and
  claim its work (attempt counted, lease set) in one round trip, reading what the work needs;
* :meth:`RunStore.commit` — compare-and-set the version as the claim's holder, append messages,
  emit events, record the checkpoint and the outbox of tasks to publish next;
* :meth:`RunStore.record_result` — one tool result once per ``(run, step, call)``, and the fan-in:
  the last result commits the OBSERVING head;
* :meth:`RunStore.inspect` / :meth:`RunStore.recover` — the sweeper's look at a run whose lease
  time came, and its hand-on under a new epoch.

A commit costs the same at step 50 as at step 1: messages are appended, never rewritten. Every
script can be replayed after a lost reply (each write carries an op id it recognises), so the
Redis client may retry them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import redis

from shared import protocol
from shared.errors import InternalInvariant, InvalidRequest
from shared.events import Event, dump_event, load_event
from shared.keys import Keys
from shared.messages import MESSAGE_ADAPTER, Message, dump_message
from shared.scripts import is_cluster, register_scripts, run_many
from shared.settings import Settings
from shared.state import Decision, Phase, RunHead, TaskSpec, ToolResult

if TYPE_CHECKING:
    # The archive's code (SQL, sqlite3, the database drivers) loads when an archive is opened:
    # a worker or client without one never needs it.
    from shared.archive import Archive

__all__ = [
    "CURSOR_PATTERN",
    "PUBLISH_COMMANDS",
    "BrokerCommand",
    "Busy",
    "CallClaim",
    "Claim",
    "ClaimOutcome",
    "ClaimRef",
    "CommitStatus",
    "Committed",
    "Done",
    "Due",
    "HandedOn",
    "MessageCache",
    "PhaseClaim",
    "RecordStatus",
    "Recorded",
    "RunPage",
    "RunStore",
    "Stale",
    "TaskState",
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


# -- what claiming answers -----------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseClaim:
    """What a phase task asks to claim: the run at this version, phase, epoch and step."""

    run_id: str
    version: int
    phase: Phase
    epoch: int
    step: int
    #: Read the conversation (only the part this process has not cached).
    read_messages: bool = False
    #: Read the step's tool results.
    read_results: bool = False


@dataclass(frozen=True)
class CallClaim:
    """What a tool task asks to claim: one call of the run's current step."""

    run_id: str
    version: int
    epoch: int
    step: int
    call_id: str


@dataclass(frozen=True)
class Claim:
    """This delivery holds the work: do it, then commit as the claim's holder."""

    head: RunHead
    #: Claims of this work at this version, this one included (poison detection).
    attempts: int
    messages: list[Message]
    cancel_requested: bool
    #: The claim field this delivery holds (renewed by the heartbeat, ended by the commit or result).
    field: str
    token: str
    #: "none", or "expired" when an earlier delivery claimed this work and never finished it.
    prior: str
    #: The step's tool results, when asked for.
    results: list[ToolResult]
    #: The last thing known to have gone wrong with this work ("" if nothing).
    last_error: str
    #: When this delivery got the claim (this worker's clock): the start of its timeline bar.
    claimed_at: float = 0.0

    @property
    def ref(self) -> ClaimRef:
        return ClaimRef(self.field, self.token, self.claimed_at, self.attempts)


@dataclass(frozen=True)
class Busy:
    """Another delivery holds a live claim on this work; this one must do nothing."""


@dataclass(frozen=True)
class Done:
    """The tool call this delivery names already has its result: a duplicate."""


@dataclass(frozen=True)
class Stale:
    """The run is not where the delivery expected: a duplicate, a late or a forged message."""

    version: int
    phase: Phase
    epoch: int
    outbox: list[TaskSpec]
    #: Some delivery of the current outbox already claimed work.
    outbox_claimed: bool

    @property
    def terminal(self) -> bool:
        return self.phase.terminal


ClaimOutcome = Claim | Busy | Done | Stale | None


# -- what writing answers --------------------------------------------------------------------------

CommitStatus = Literal["committed", "fenced", "cancel_pending"]
RecordStatus = Literal["stale", "duplicate", "recorded", "complete"]


@dataclass(frozen=True)
class Committed:
    """What a commit did."""

    status: CommitStatus
    #: The run's epoch after a successful commit (tasks are published under it).
    epoch: int = 0
    #: The script pushed the commit's broker commands itself: nothing is left to publish.
    pushed: bool = False


@dataclass(frozen=True)
class Recorded:
    """What recording a tool result did."""

    status: RecordStatus
    #: The run's epoch when the fan-in completed (observe is published under it).
    epoch: int = 0
    #: The script pushed observe's broker commands itself: nothing is left to publish.
    pushed: bool = False


@dataclass(frozen=True)
class ClaimRef:
    """The claim a commit is made under."""

    field: str
    token: str
    #: When the claim was taken and how many claims of the work it is (0: not known).
    claimed_at: float = 0.0
    attempt: int = 0


#: One Redis command of a task's publish to a Redis broker, as kombu would run it: its name and
#: arguments (see ``worker/inline_publish.py``).
BrokerCommand = tuple[str, tuple[str, ...]]

#: The commands a commit script runs for a publish (it refuses any other).
PUBLISH_COMMANDS = frozenset({"lpush", "publish", "pexpire"})


def _push_args(epoch: int, push: Sequence[BrokerCommand]) -> list[str]:
    """Broker commands as script arguments: the epoch they were built for, their count, then name,
    argument count and arguments of each."""
    flat = [str(epoch), str(len(push))]
    for name, args in push:
        if name not in PUBLISH_COMMANDS:
            raise InternalInvariant(f"publish command {name!r} is not one a commit may run")
        flat += [name, str(len(args)), *args]
    return flat


# -- what the sweeper sees -------------------------------------------------------------------------

TaskState = Literal["done", "live", "expired", "unclaimed"]


@dataclass(frozen=True)
class Due:
    """A run whose current phase needs a decision: a claim expired, or tasks waited past their time."""

    run_id: str
    version: int
    epoch: int
    phase: Phase
    step: int
    outbox: list[TaskSpec]
    #: Per task ("" for the phase, else the call id): done, live, expired or unclaimed.
    states: dict[str, TaskState]
    #: How many times the broker was already checked for this version's unclaimed tasks.
    queued_checks: int

    @property
    def expired(self) -> list[str]:
        return [k for k, s in self.states.items() if s == "expired"]

    @property
    def unclaimed(self) -> list[str]:
        return [k for k, s in self.states.items() if s == "unclaimed"]

    def task_of(self, key: str) -> TaskSpec | None:
        """The outbox task of one state key (the phase's task, or one call's)."""
        for spec in self.outbox:
            if key == "" or spec.arguments.get("call_id") == key:
                return spec
        return None


@dataclass(frozen=True)
class HandedOn:
    """A phase the sweeper handed on under a new epoch."""

    epoch: int
    #: Hand-ons of this version's tasks because their messages had vanished from the broker.
    lost: int
    #: The state keys whose tasks are to be published again under ``epoch``.
    tasks: list[str]


@dataclass(frozen=True)
class RunPage:
    """One page of a listing, newest first; ``next_cursor`` continues it (None: nothing older)."""

    runs: list[RunHead]
    next_cursor: str | None


#: Index entries read per shard and round of a listing.
_LIST_BATCH = 64


class RunStore:
    """Reads and atomic writes of run state in one Redis (or Redis Cluster, key layout permitting).

    With an archive (``Settings.archive_url``), every read of a run that is no longer in Redis is
    answered from the archive, in the same types: status, conversation, checkpoints, events, tool
    results, callback state, threads and listings span both.
    """

    def __init__(self, client: redis.Redis, settings: Settings, archive: Archive | None = None) -> None:
        self.redis = client
        self.settings = settings
        self.keys = Keys(settings.prefix, settings.shards)
        self._scripts = register_scripts(client)
        self._messages = MessageCache()
        self._archive = archive
        self._archive_lock = threading.Lock()

    @property
    def archive(self) -> Archive | None:
        """The archive finished runs move to (opened on first use, once per process), if any."""
        if self._archive is None and self.settings.archive_url:
            with self._archive_lock:
                if self._archive is None:
                    from shared.archive import open_archive

                    self._archive = open_archive(self.settings.archive_url)
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

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return self._scripts[name](keys=list(keys), args=[str(a) for a in args])

    @property
    def _lease_ms(self) -> int:
        return int(self.settings.lease_s * 1000)

    @property
    def _queued_ms(self) -> int:
        return int(self.settings.queued_lease_s * 1000)

    # -- reading ---------------------------------------------------------------------------

    def load(self, run_id: str) -> RunHead | None:
        head = self._load_redis(run_id)
        if head is None and (archive := self.archive) is not None:
            return archive.load(run_id)
        return head

    def _load_redis(self, run_id: str) -> RunHead | None:
        raw = self.redis.hmget(self.keys.run(run_id), protocol.BODY, protocol.REQUEST, protocol.EPOCH)
        if raw[0] is None:
            return None
        return RunHead.compose(_s(raw[0]), _s(raw[1]), int(raw[2] or 0))

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

    # -- listing ---------------------------------------------------------------------------

    def list_runs(
        self,
        tenant: str | None,
        *,
        agent: str | None = None,
        status: str | None = None,
        thread_id: str | None = None,
        since: float | None = None,
        cursor: str | None = None,
        limit: int = 50,
        max_scan: int = 2000,
    ) -> RunPage:
        """A tenant's runs, newest first, from the indexes the scripts keep (never a key scan).

        One index is read (the thread's, else the agent's, else the status's, else all of the
        tenant's), merged across the shards by creation time; other filters are applied to the
        runs read. At most ``max_scan`` index entries are read per page, so a page may hold fewer
        than ``limit`` runs and still have a ``next_cursor``. With an archive, its runs are merged
        in by the same order (creation ms, run id), so one cursor pages through both.
        """
        position = _parse_cursor(cursor)
        floor = int(since * 1000) if since is not None else None
        live, stop = self._list_redis(tenant, agent, status, thread_id, floor, position, limit, max_scan)
        archive = self.archive
        if archive is None:
            return _page(live, limit, stop)
        from shared.archive import ListingFilter

        where = ListingFilter(tenant, agent=agent, status=status, thread_id=thread_id, since_ms=floor)
        archived = archive.list_runs(where, position, limit)
        if len(archived) == limit:  # the archive may hold more below its last one
            last = (archived[-1][0], archived[-1][1].run_id)
            stop = last if stop is None else max(stop, last)
        in_redis = {head.run_id for _, head in live}
        merged = live + [(ms, head) for ms, head in archived if head.run_id not in in_redis]
        merged.sort(key=lambda entry: (entry[0], entry[1].run_id), reverse=True)
        if stop is not None:
            # Below where one source stopped reading, the other's runs wait for the next page.
            merged = [(ms, head) for ms, head in merged if (ms, head.run_id) >= stop]
        return _page(merged, limit, stop)

    def _list_redis(
        self,
        tenant: str | None,
        agent: str | None,
        status: str | None,
        thread_id: str | None,
        floor: int | None,
        position: tuple[int, str] | None,
        limit: int,
        max_scan: int,
    ) -> tuple[list[tuple[int, RunHead]], tuple[int, str] | None]:
        """Up to ``limit`` runs in Redis below ``position`` (with their creation ms), and where the
        reading stopped when there may be more (None: nothing older is left)."""
        k = self.keys
        if thread_id is not None:
            dimension, value = "thread", thread_id
        elif agent is not None:
            dimension, value = "agent", agent
        elif status is not None:
            dimension, value = "status", status
        else:
            dimension, value = "all", ""
        keys = [k.index(shard, tenant, dimension, value) for shard in range(k.shards)]
        found: list[tuple[int, RunHead]] = []
        scanned = 0
        while len(found) < limit and scanned < max_scan:
            entries, exhausted = self._index_round(keys, position, floor)
            if not entries:
                return found, None
            for score, run_id in entries:
                scanned += 1
                position = (score, run_id)
                head = self._load_redis(run_id)
                if head is None:
                    self.redis.zrem(k.index_of(run_id, tenant, dimension, value), run_id)  # expired
                    continue
                if (
                    (agent is None or head.agent == agent)
                    and (status is None or head.status == status)
                    and (thread_id is None or head.thread_id == thread_id)
                ):
                    found.append((score, head))
                    if len(found) == limit:
                        break
            if exhausted and position == entries[-1]:
                if len(found) < limit:
                    return found, None
        return found, position

    def _index_round(
        self, keys: list[str], position: tuple[int, str] | None, floor: int | None
    ) -> tuple[list[tuple[int, str]], bool]:
        """The next index entries after ``position``, merged newest first, that every shard agrees on.

        Entries are ordered by (creation ms, run id), both descending. A shard that returned a full
        batch may hold more entries below its last one; only the entries at or above the highest
        such last entry are certain to be complete across shards. Returns them and whether every
        shard is exhausted.
        """
        top = "+inf" if position is None else str(position[0])
        bottom = "-inf" if floor is None else str(floor)
        with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.zrevrangebyscore(key, top, bottom, start=0, num=_LIST_BATCH, withscores=True)
            replies = pipe.execute()
        entries: list[tuple[int, str]] = []
        boundary: tuple[int, str] | None = None
        for key, reply in zip(keys, replies, strict=True):
            batch, full = self._after(position, reply, _LIST_BATCH)
            num = _LIST_BATCH
            while full and not batch:
                # Every entry read sits at the cursor's own millisecond: read further into it.
                num *= 4
                more = self.redis.zrevrangebyscore(key, top, bottom, start=0, num=num, withscores=True)
                batch, full = self._after(position, cast(list[tuple[Any, float]], more), num)
            if full:
                boundary = batch[-1] if boundary is None else max(boundary, batch[-1])
            entries.extend(batch)
        entries.sort(reverse=True)
        if boundary is not None:
            entries = [e for e in entries if e >= boundary]
        return entries, boundary is None

    @staticmethod
    def _after(
        position: tuple[int, str] | None, reply: list[tuple[Any, float]], num: int
    ) -> tuple[list[tuple[int, str]], bool]:
        """The entries of one shard's reply that come after ``position``, and whether it was full."""
        batch = [(int(score), _s(member)) for member, score in reply]
        if position is not None:
            batch = [e for e in batch if e < position]
        return batch, len(reply) == num

    def trim_indexes(self, shard: int, cutoff_ms: float) -> int:
        """Drop index entries of runs created before ``cutoff_ms`` (past the retention); returns how many."""
        registry = self.keys.indexes(shard)
        removed = 0
        if not self.settings.archive_url:
            # Without an archive nothing takes ended runs out: entries past the retention name
            # runs whose keys expired (with an archive, the archiver removes them).
            removed += int(self.redis.zremrangebyscore(self.keys.ended(shard), "-inf", f"({cutoff_ms}"))
        for key in self.redis.sscan_iter(registry, count=200):
            removed += int(self.redis.zremrangebyscore(key, "-inf", f"({cutoff_ms}"))
            if self.redis.zcard(key) == 0:
                self.redis.srem(registry, key)
        return removed

    def inflight(self, tenant: str | None) -> int:
        """Runs of ``tenant`` not ended yet, over every shard."""
        with self.redis.pipeline(transaction=False) as pipe:
            for shard in range(self.keys.shards):
                pipe.hget(self.keys.inflight(shard), tenant or "-")
            return sum(int(v or 0) for v in pipe.execute())

    # -- creating --------------------------------------------------------------------------

    def create(self, head: RunHead, outbox: Sequence[TaskSpec]) -> bool:
        """Create an IDLE run at version 1; False if a run with this id already exists."""
        if head.version != 1 or head.phase is not Phase.IDLE:
            raise InternalInvariant(f"a run is created IDLE at version 1, not {head.phase} v{head.version}")
        k, run_id, tenant = self.keys, head.run_id, head.tenant
        indexes = [k.index_of(run_id, tenant), k.index_of(run_id, tenant, "agent", head.agent)]
        indexes.append(k.index_of(run_id, tenant, "status", head.status))
        if head.thread_id is not None:
            indexes.append(k.index_of(run_id, tenant, "thread", head.thread_id))
        reply = self._run(
            "create",
            [
                k.run(run_id),
                k.checkpoints(run_id),
                k.leases_of(run_id),
                k.runs_index_of(run_id),
                k.indexes_of(run_id),
                k.inflight_of(run_id),
                *indexes,
            ],
            [
                run_id,
                new_op(),
                head.dump_request(),
                head.dump_body(),
                _dump_outbox(outbox),
                self._queued_ms,
                tenant or "-",
            ],
        )
        return _s(reply) == "created"

    # -- claiming --------------------------------------------------------------------------

    def claim_phase(self, want: PhaseClaim, holder: str) -> ClaimOutcome:
        """Claim a phase for this delivery, in one round trip (see ``claim_phase.lua``)."""
        k, run_id = self.keys, want.run_id
        token = new_token()
        cached = self._messages.get(run_id) if want.read_messages else None
        reply = self._run(
            "claim_phase",
            [
                k.run(run_id),
                k.attempts(run_id),
                k.leases_of(run_id),
                k.messages(run_id),
                k.results(run_id, want.step),
            ],
            [
                run_id,
                want.version,
                want.phase.value,
                want.epoch,
                want.step,
                token,
                holder,
                self._lease_ms,
                (len(cached) if cached is not None else 0) if want.read_messages else "",
                "1" if want.read_results else "0",
            ],
        )
        status = _s(reply[0])
        if status != "ok":
            return self._unclaimed(status, reply)
        head = self._head_of(reply[1])
        messages: list[Message] = []
        if want.read_messages:
            messages = [*(cached or []), *(MESSAGE_ADAPTER.validate_json(m) for m in reply[3])]
            if len(messages) != head.message_count:
                # Only appends ever happen, so this means the cache is not this run's prefix.
                messages = self.load_messages(run_id)
            self._messages.put(run_id, messages)
        return Claim(
            head=head,
            attempts=int(reply[2]),
            messages=messages,
            cancel_requested=_s(reply[1][3] or "") == "1",
            field=protocol.RUNNING,
            token=token,
            prior=_s(reply[4]),
            results=[ToolResult.model_validate_json(r) for r in reply[5]],
            last_error=_s(reply[6]),
            claimed_at=time.time(),
        )

    def claim_call(self, want: CallClaim, holder: str) -> ClaimOutcome:
        """Claim one tool call for this delivery (see ``claim_call.lua``)."""
        k, run_id = self.keys, want.run_id
        token = new_token()
        reply = self._run(
            "claim_call",
            [k.run(run_id), k.attempts(run_id), k.leases_of(run_id), k.results(run_id, want.step)],
            [run_id, want.version, want.epoch, want.step, want.call_id, token, holder, self._lease_ms],
        )
        status = _s(reply[0])
        if status != "ok":
            return self._unclaimed(status, reply)
        return Claim(
            head=self._head_of(reply[1]),
            attempts=int(reply[2]),
            messages=[],
            cancel_requested=_s(reply[1][3] or "") == "1",
            field=protocol.call_claim(want.step, want.call_id),
            token=token,
            prior=_s(reply[3]),
            results=[],
            last_error=_s(reply[4]),
            claimed_at=time.time(),
        )

    @staticmethod
    def _head_of(raw: Sequence[Any]) -> RunHead:
        return RunHead.compose(_s(raw[0]), _s(raw[1]), int(raw[2]))

    @staticmethod
    def _unclaimed(status: str, reply: Sequence[Any]) -> ClaimOutcome:
        if status == "missing":
            return None
        if status == "busy":
            return Busy()
        if status == "done":
            return Done()
        if status != "stale":
            raise InternalInvariant(f"unexpected claim status {status!r}")
        version, phase, _, epoch, outbox, claimed = (_s(v) if v is not None else "" for v in reply[1][:6])
        return Stale(
            version=int(version),
            phase=Phase(phase),
            epoch=int(epoch),
            outbox=_load_outbox(outbox or "[]"),
            outbox_claimed=claimed == "1",
        )

    def renew(self, claims: Sequence[tuple[str, str, str, bool]]) -> list[tuple[bool, bool]]:
        """Renew claims ``(run_id, field, token, extend)`` in one round trip.

        Returns (still held, cancel requested) for each. ``extend`` False only checks the claim
        (a tool past its deadline is left to expire and be handed on).
        """
        if not claims:
            return []
        k = self.keys
        replies = run_many(
            self.redis,
            self._scripts["renew"],
            [
                ([k.run(run_id), k.leases_of(run_id)], [run_id, field, token, self._lease_ms, int(extend)])
                for run_id, field, token, extend in claims
            ],
        )
        return [(int(r[0]) == 1, int(r[1]) == 1) for r in replies]

    def replicate(self, run_id: str, timeout_ms: int) -> int:
        """Wait until a replica holds every write made so far to ``run_id``'s slot (``WAIT 1``),
        at most ``timeout_ms``; returns how many replicas acknowledged (0: none in time).

        ``WAIT`` covers the writes of the connection it is sent on, and a connection of the pool may
        not be the one the claim went through; so it follows a write of its own on the same
        connection, to the shard's ``sync`` key, which the replication stream orders after the claim.
        On a cluster the pair goes to the primary of the run's slot; a slot that moved since (a
        failover) raises, and the lease hands the work on.
        """
        key = self.keys.sync_of(run_id)
        if is_cluster(self.redis):
            node = self.redis.get_node_from_key(key)  # type: ignore[attr-defined]
            client: Any = self.redis.get_redis_connection(node)  # type: ignore[attr-defined]
        else:
            client = self.redis
        with client.pipeline(transaction=False) as pipe:
            pipe.set(key, run_id, px=60_000)
            pipe.execute_command("WAIT", 1, timeout_ms)
            replies = pipe.execute()
        return int(replies[1])

    def release(self, run_id: str, field: str, token: str) -> bool:
        """Give up a claim this token holds (atomically: only if it still holds it)."""
        k = self.keys
        reply = self._run("release", [k.run(run_id), k.attempts(run_id)], [field, "token", token, "0", ""])
        return int(reply) == 1

    def expire_dead_holder(self, run_id: str, version: int, field: str, holder: str, reason: str) -> bool:
        """The process ``holder`` died (its worker saw it): expire its claim now, noting why."""
        k = self.keys
        reply = self._run(
            "release", [k.run(run_id), k.attempts(run_id)], [field, "holder", holder, version, reason[:500]]
        )
        return int(reply) == 1

    # -- committing ------------------------------------------------------------------------

    def commit(
        self,
        current: RunHead,
        head: RunHead,
        claim: ClaimRef | None,
        messages: Sequence[Message] = (),
        events: Sequence[Event] = (),
        outbox: Sequence[TaskSpec] = (),
        push: Sequence[BrokerCommand] = (),
    ) -> Committed:
        """Compare-and-set ``head`` over ``current`` (its version) as the holder of ``claim``.

        ``claim`` None commits without a claim (the sweeper failing a poisoned run): allowed only
        while no delivery holds a live claim on the phase. The run's status index follows it from
        ``current``'s status to ``head``'s.

        ``push``: the broker commands that publish ``outbox`` under ``current``'s epoch (Redis
        broker on this server only). The script runs them with the commit when the run is still at
        that epoch, and says so (``Committed.pushed``); otherwise the caller publishes.
        """
        expected_version = current.version
        if head.version != expected_version + 1:
            raise InternalInvariant(f"commit of version {head.version} over {expected_version}")
        limits = self.settings.limits
        k, run_id, tenant = self.keys, head.run_id, head.tenant
        kind = (
            "terminal" if head.terminal else ("parked" if head.phase is Phase.AWAITING_APPROVAL else "live")
        )
        body = head.dump_body()
        args: list[Any] = [
            run_id,
            new_op(),
            expected_version,
            claim.field if claim else "",
            claim.token if claim else "",
            head.version,
            head.phase.value,
            head.step,
            body,
            _dump_outbox(outbox),
            ",".join(c.id for c in head.pending_calls) if head.phase is Phase.ACTING else "",
            kind,
            self._queued_ms,
            self.settings.retention_s,
            limits.events_maxlen,
            len(messages),
            len(events),
            tenant or "-",
            "1" if kind == "terminal" and head.callback is not None else "0",
            *(dump_message(m) for m in messages),
            *(dump_event(e) for e in events),
            *_push_args(current.epoch, push),
        ]
        # A finished run's per-step keys expire with it (bounded: steps <= max_steps).
        extra = (
            [k.attempts(run_id)] + [k.results(run_id, step) for step in range(1, head.step + 1)]
            if kind == "terminal"
            else []
        )
        status_keys = [k.index_of(run_id, tenant, "status", s.status) for s in (current, head)]
        reply = self._run(
            "commit",
            [
                k.run(run_id),
                k.messages(run_id),
                k.checkpoints(run_id),
                k.events(run_id),
                k.leases_of(run_id),
                k.indexes_of(run_id),
                k.inflight_of(run_id),
                *status_keys,
                k.ended_of(run_id),
                *extra,
            ],
            args,
        )
        status = _s(reply[0])
        if status != "committed":
            return Committed(status)  # type: ignore[arg-type]
        return Committed("committed", int(reply[1]), len(reply) > 2 and _s(reply[2]) == "1")

    def record_result(
        self,
        head: RunHead,
        claim: ClaimRef,
        result: ToolResult,
        event: Event,
        observing: RunHead,
        observe: TaskSpec,
        push: Sequence[BrokerCommand] = (),
    ) -> Recorded:
        """Record a call's result once; the last result of the step commits ``observing``.

        ``push``: the broker commands that publish ``observe`` under ``head``'s epoch, run by the
        script with the fan-in as :meth:`commit` runs its own.
        """
        k, run_id = self.keys, head.run_id
        reply = self._run(
            "record_result",
            [
                k.run(run_id),
                k.results(run_id, head.step),
                k.events(run_id),
                k.leases_of(run_id),
                k.checkpoints(run_id),
            ],
            [
                run_id,
                new_op(),
                head.version,
                head.step,
                result.call_id,
                claim.token,
                result.model_dump_json(),
                dump_event(event),
                len(head.done_calls) + len(head.pending_calls),  # every wave's results count
                observing.version,
                observing.dump_body(),
                _dump_outbox([observe]),
                self._queued_ms,
                self.settings.limits.events_maxlen,
                *_push_args(head.epoch, push),
            ],
        )
        status = _s(reply[0])
        if status != "complete":
            return Recorded(status)  # type: ignore[arg-type]
        return Recorded("complete", int(reply[1]), len(reply) > 2 and _s(reply[2]) == "1")

    def record_child(self, parent: RunHead, result: ToolResult, event: Event) -> int | None:
        """Record a child run's outcome as ``parent``'s result for its call, once (its event with it).

        Returns how many results the parent's step has now, or None if the parent no longer waits
        for its children at that step.
        """
        k, run_id = self.keys, parent.run_id
        reply = self._run(
            "record_child",
            [k.run(run_id), k.results(run_id, parent.step), k.events(run_id)],
            [
                parent.step,
                result.call_id,
                result.model_dump_json(),
                dump_event(event),
                self.settings.limits.events_maxlen,
            ],
        )
        return None if _s(reply[0]) == "stale" else int(reply[1])

    # -- human decisions and cancels -------------------------------------------------------

    def submit_decision(self, run_id: str, version: int, decision: Decision) -> bool:
        """Store a human's decision on a run parked at ``version``; False if it is not parked there."""
        reply = self._run("decide", [self.keys.run(run_id)], [version, decision.model_dump_json()])
        return int(reply) == 1

    def load_decision(self, run_id: str) -> Decision | None:
        raw = self.redis.hget(self.keys.run(run_id), protocol.DECISION)
        return Decision.model_validate_json(raw) if raw else None

    def join_thread(self, tenant: str | None, thread_id: str, run_id: str) -> list[str]:
        """Add ``run_id`` to its tenant's thread (once, atomically); the thread's run ids, oldest first."""
        key = self.keys.thread(tenant, thread_id)
        reply = self._run("join_thread", [key], [run_id, self.settings.retention_s])
        ids = [_s(r) for r in reply]
        if ids == [run_id] and (archive := self.archive) is not None:
            # The thread's list expired with the retention; its earlier runs are in the archive.
            ids = [*(r for r in archive.thread_runs(tenant, thread_id) if r != run_id), run_id]
        return ids

    def finish_callback(self, run_id: str, token: str, outcome: str, state: str, wait_s: float = 0) -> bool:
        """End one callback delivery attempt as the claim's holder (see ``finish_callback.lua``)."""
        reply = self._run(
            "finish_callback",
            [self.keys.run(run_id), self.keys.leases_of(run_id)],
            [run_id, token, outcome, state, int(wait_s * 1000), self._queued_ms],
        )
        return int(reply) == 1

    def callback_state(self, run_id: str) -> str | None:
        """The JSON of a run's callback delivery (attempts, last error), if it has a callback."""
        raw = self.redis.hget(self.keys.run(run_id), protocol.CALLBACK_STATE)
        if raw is None and (archive := self._archived(run_id)) is not None:
            return archive.callback_state(run_id)
        return _s(raw) if raw is not None else None

    def throttle(self, run_id: str, version: int, token: str, wait_s: float, why: str) -> int:
        """Give a think claimed by ``token`` back for ``wait_s``: no provider capacity (see
        ``throttle.lua``). Returns the run's throttle count, 0 if the claim is no longer held."""
        k = self.keys
        reply = self._run(
            "throttle",
            [k.run(run_id), k.attempts(run_id), k.leases_of(run_id)],
            [run_id, version, token, int(wait_s * 1000), self._queued_ms, why],
        )
        return int(reply)

    def throttled(self, run_id: str) -> tuple[dict[str, Any], int] | None:
        """Why the run's think last waited for provider capacity, and how often it did (None: never)."""
        raw, count = self.redis.hmget(self.keys.run(run_id), protocol.THROTTLED, protocol.THROTTLES)
        if raw is None:
            return None
        return json.loads(_s(raw)), int(count or 0)

    def request_cancel(self, run_id: str) -> Phase | None:
        phase = _s(self._run("cancel", [self.keys.run(run_id)], []))
        if not phase and (archive := self.archive) is not None:
            archived = archive.load(run_id)  # ended long ago: nothing to cancel
            return archived.phase if archived is not None else None
        return Phase(phase) if phase else None

    # -- the sweeper's side ----------------------------------------------------------------

    def due(self, shard: int, limit: int = 100) -> list[str]:
        """Run ids of ``shard`` whose lease time has come (by Redis's clock)."""
        return [_s(r) for r in self._run("due", [self.keys.leases(shard)], [limit])]

    def due_everywhere(self, limit: int = 100) -> list[list[str]]:
        """:meth:`due` of every shard, in one pipelined round trip (a list per shard; one call per
        shard on a cluster, whose shards lie on several primaries)."""
        calls = [([self.keys.leases(shard)], [str(limit)]) for shard in range(self.keys.shards)]
        return [[_s(r) for r in due] for due in run_many(self.redis, self._scripts["due"], calls)]

    def inspect(self, run_id: str) -> Due | Literal["alive", "settled"]:
        """Look at a run whose lease time came (see ``inspect.lua``)."""
        k = self.keys
        step = int(self.redis.hget(k.run(run_id), protocol.STEP) or 0)
        for _ in range(3):
            reply = self._run(
                "inspect", [k.run(run_id), k.leases_of(run_id), k.results(run_id, step)], [run_id, step]
            )
            status = _s(reply[0])
            if status != "moved":
                break
            step = int(reply[1])
        if status in ("gone", "settled", "moved"):
            return "settled"
        if status == "alive":
            return "alive"
        flat = [_s(x) for x in reply[6]]
        states: dict[str, TaskState] = dict(zip(flat[0::2], flat[1::2], strict=True))  # type: ignore[arg-type]
        return Due(
            run_id=run_id,
            version=int(reply[1]),
            epoch=int(reply[2]),
            phase=Phase(_s(reply[3])),
            step=int(reply[4]),
            outbox=_load_outbox(_s(reply[5])),
            states=states,
            queued_checks=int(reply[7]),
        )

    def wait_in_queue(self, due: Due, wait_s: float) -> bool:
        """Every unclaimed task of ``due`` is still in the broker: look again after ``wait_s``."""
        reply = self._recover(due, "wait", [], wait_s, "")
        return _s(reply[0]) == "waiting"

    def hand_on(self, due: Due, missing: Sequence[str], reason: str) -> HandedOn | None:
        """Hand the phase on under a new epoch; None if the run changed since it was inspected."""
        reply = self._recover(due, "hand_on", missing, 0, reason)
        if _s(reply[0]) != "handed_on":
            return None
        return HandedOn(epoch=int(reply[1]), lost=int(reply[2]), tasks=[_s(t) for t in reply[3]])

    def mark_unsent(self, run_id: str, version: int, epoch: int, delay_s: float) -> bool:
        """A publish of the run's outbox at ``version`` and ``epoch`` failed: the sweeper publishes
        its unclaimed tasks again after ``delay_s``, without asking the broker for them and
        without counting them lost (``unsent.lua``). False if the run moved on or is gone."""
        reply = self._run(
            "unsent",
            [self.keys.run(run_id), self.keys.leases_of(run_id)],
            [run_id, version, epoch, int(delay_s * 1000)],
        )
        return _s(reply) == "1"

    def _recover(self, due: Due, action: str, missing: Sequence[str], wait_s: float, reason: str) -> Any:
        k, run_id = self.keys, due.run_id
        return self._run(
            "recover",
            [k.run(run_id), k.leases_of(run_id), k.attempts(run_id), k.results(run_id, due.step)],
            [
                run_id,
                new_op(),
                action,
                due.version,
                due.epoch,
                due.step,
                ",".join(m or "-" for m in missing),
                int(wait_s * 1000),
                self._queued_ms,
                reason,
            ],
        )

    # -- events ----------------------------------------------------------------------------

    def emit(self, run_id: str, events: Sequence[Event]) -> None:
        """Append events that are not part of a commit (live token deltas)."""
        if not events:
            return
        key = self.keys.events(run_id)
        with self.redis.pipeline(transaction=False) as pipe:
            for e in events:
                pipe.xadd(
                    key, {"e": dump_event(e)}, maxlen=self.settings.limits.events_maxlen, approximate=True
                )
            pipe.execute()

    def read_events(self, run_id: str, after: str = "0-0", count: int = 1000) -> list[tuple[str, Event]]:
        raw = self.redis.xrange(
            self.keys.events(run_id), min=f"({after}" if after != "0-0" else "-", count=count
        )
        if not raw and (archive := self._archived(run_id)) is not None:
            return archive.events(run_id, after, count)
        return _entries(raw)

    def wait_events(self, run_id: str, after: str, timeout_s: float) -> list[tuple[str, Event]]:
        """Block up to ``timeout_s`` for events after ``after`` (XREAD BLOCK; polled when embedded)."""
        key = self.keys.events(run_id)
        if self.settings.embedded:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if batch := self.read_events(run_id, after):
                    return batch
                time.sleep(0.01)
            return []
        reply: Any = self.redis.xread({key: after}, count=500, block=max(1, int(timeout_s * 1000)))
        return _entries(reply[0][1] if reply else [])


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


def _page(entries: list[tuple[int, RunHead]], limit: int, stop: tuple[int, str] | None) -> RunPage:
    """The first ``limit`` of ``entries`` (newest first) as a page; ``stop`` is where the sources
    stopped reading when they may hold more (None: they are exhausted)."""
    runs = entries[:limit]
    if len(entries) > limit or (len(runs) == limit and stop is not None):
        last = runs[-1]
        return RunPage([h for _, h in runs], f"{last[0]}.{last[1].run_id}")
    if stop is not None:
        return RunPage([h for _, h in runs], f"{stop[0]}.{stop[1]}")
    return RunPage([h for _, h in runs], None)


#: A listing cursor: the creation time (ms) and the id of the last run of the previous page.
CURSOR_PATTERN = r"^[0-9]{1,15}\..+$"


def _parse_cursor(cursor: str | None) -> tuple[int, str] | None:
    if not cursor:
        return None
    score, _, run_id = cursor.partition(".")
    if not score.isdigit() or len(score) > 15 or not run_id:
        raise InvalidRequest(f"bad listing cursor {cursor[:80]!r}")
    return int(score), run_id


def _entries(raw: Any) -> list[tuple[str, Event]]:
    entries = []
    for eid, fields in raw:
        event = load_event(fields["e"])
        event.stream_id = _s(eid)
        entries.append((event.stream_id, event))
    return entries


def _dump_outbox(outbox: Sequence[TaskSpec]) -> str:
    return "[" + ",".join(t.model_dump_json() for t in outbox) + "]"


def _load_outbox(raw: str) -> list[TaskSpec]:
    value = json.loads(raw)
    return [TaskSpec.model_validate(t) for t in value] if isinstance(value, list) else []
