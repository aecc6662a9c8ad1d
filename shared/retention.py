"""Retention: what outlived it, and removing it (``wesichain gc``); how full Redis is (submits).

A terminal run's keys expire ``retention_s`` after it ended (the commit script sets their TTL),
and the sweeper trims the listing indexes by creation time. What can still be left behind, and
what :class:`GarbageCollector` finds and removes:

* index entries (the listing indexes, the run index, the lease sets) naming runs whose keys are
  gone: they expired, or were deleted by hand;
* index entries of runs created before the retention (the sweeper's trim, done now);
* keys of a run whose head is gone and that would never expire (no TTL): orphans;
* ended runs without a TTL (written before retention existed, or by hand): removed when they ended
  longer than the retention ago, else given the TTL they should have. With an archive configured
  nothing ended is removed: every ended run is handed to the archiver instead (entered in its
  shard's ended set unless it is there), which moves it out of Redis once the archive holds it;
* entries of the ended set (what the archiver works through) naming runs that are gone.

It walks the key space with ``SCAN`` (in batches, never blocking Redis) and reads or deletes in
pipelines; ``dry_run`` only reports.

:class:`MemoryGuard` is what keeps a full Redis from losing runs. With ``maxmemory-policy
noeviction`` Redis refuses writes past ``maxmemory``, and a run that cannot write its next claim
or commit stalls; so new runs are refused once Redis uses ``Settings.submit_max_memory`` of its
``maxmemory`` (0.9 by default), with a :class:`~shared.errors.StoreFull` that says so, and the
runs already going finish in the headroom left.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from shared import protocol
from shared.errors import StoreFull
from shared.keys import Keys
from shared.scripts import is_cluster
from shared.settings import ENV_SUBMIT_MEMORY, Settings
from shared.state import TERMINAL_PHASES

__all__ = ["GarbageCollector", "GcReport", "MemoryGuard", "MemoryState", "full_message"]

_BATCH = 500
_SUFFIX = re.compile(r":(messages|checkpoints|events|attempts|step:\d+:results)$")


@dataclass
class GcReport:
    """What a collection found (and removed, unless it was a dry run)."""

    dry_run: bool
    #: Index entries naming runs that no longer exist (listing, run and lease indexes).
    index_entries_of_gone_runs: int = 0
    #: Listing index entries of runs created before the retention.
    index_entries_past_retention: int = 0
    #: Empty index keys dropped from their shard's registry.
    empty_indexes: int = 0
    #: Keys of runs whose head is gone, without a TTL.
    orphan_keys: int = 0
    #: Ended runs without a TTL, ended longer than the retention ago (all their keys).
    expired_runs: int = 0
    #: Ended runs without a TTL that were given the rest of their retention.
    runs_given_ttl: int = 0
    #: Ended runs waiting for their TTL, as they should (not touched).
    runs_expiring: int = 0
    #: Ended runs without a TTL past the retention, left for the archiver (an archive is configured).
    runs_awaiting_archive: int = 0
    #: Ended runs entered in their shard's ended set for the archiver, which did not know of them
    #: (they ended before the archive was configured).
    runs_handed_to_archiver: int = 0
    #: Runs not ended (not touched).
    live_runs: int = 0
    #: ``MEMORY USAGE`` of the keys removed (or that would be).
    bytes_freed: int = 0
    keys_scanned: int = 0
    seconds: float = 0.0
    memory: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class GarbageCollector:
    """Finds (and removes) what outlived the retention in one deployment's keys."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.redis = client
        self.settings = settings
        self.keys = Keys(settings.prefix, settings.shards)

    def collect(self, *, dry_run: bool = False) -> GcReport:
        started = time.monotonic()
        report = GcReport(dry_run=dry_run)
        now_ms = self._now_ms()
        cutoff_ms = now_ms - self.settings.retention_s * 1000
        self._runs(now_ms, report)  # first: the index pass then drops the runs removed here
        for shard in range(self.keys.shards):
            self._indexes(shard, cutoff_ms, report)
        report.memory = MemoryGuard(self.redis, self.settings).state().as_dict()
        report.seconds = round(time.monotonic() - started, 3)
        return report

    def _now_ms(self) -> int:
        seconds, micros = self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    # -- indexes ---------------------------------------------------------------------------------

    def _indexes(self, shard: int, cutoff_ms: int, report: GcReport) -> None:
        k = self.keys
        registry = k.indexes(shard)
        listing = [_text(key) for key in self.redis.sscan_iter(registry, count=_BATCH)]
        for key in [*listing, k.runs_index(shard), k.leases(shard), k.ended(shard)]:
            floor = float("-inf")
            if key in listing or key == k.runs_index(shard):  # scored by creation time
                floor = cutoff_ms
                past = int(self.redis.zcount(key, "-inf", f"({cutoff_ms}"))
                report.index_entries_past_retention += past
                if past and not report.dry_run:
                    self.redis.zremrangebyscore(key, "-inf", f"({cutoff_ms}")
            entries = (m for m, score in self.redis.zscan_iter(key, count=_BATCH) if score >= floor)
            for members in _batches(entries):
                gone = [m for m, exists in zip(members, self._exist(members), strict=True) if not exists]
                report.index_entries_of_gone_runs += len(gone)
                if gone and not report.dry_run:
                    self.redis.zrem(key, *gone)
            if key in listing and not report.dry_run and int(self.redis.zcard(key)) == 0:
                self.redis.srem(registry, key)
                report.empty_indexes += 1

    def _exist(self, run_ids: list[str]) -> list[bool]:
        with self.redis.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.exists(self.keys.run(run_id))
            return [bool(v) for v in pipe.execute()]

    # -- runs ------------------------------------------------------------------------------------

    def _runs(self, now_ms: int, report: GcReport) -> None:
        pattern = _escape(self.settings.prefix) + "*:run:*"
        for batch in _batches(self.redis.scan_iter(match=pattern, count=_BATCH)):
            report.keys_scanned += len(batch)
            with self.redis.pipeline(transaction=False) as pipe:
                for key in batch:
                    pipe.type(key)
                    pipe.ttl(key)
                replies = pipe.execute()
            kinds = {key: (_text(replies[2 * i]), int(replies[2 * i + 1])) for i, key in enumerate(batch)}
            hashes = [key for key, (kind, _) in kinds.items() if kind == "hash"]
            with self.redis.pipeline(transaction=False) as pipe:
                for key in hashes:
                    pipe.hmget(key, protocol.BODY, protocol.PHASE)
                heads = dict(zip(hashes, pipe.execute(), strict=True))
            for key, (_, ttl) in kinds.items():
                body, phase = heads.get(key, (None, None))
                if body is not None:
                    self._run(key, _text(phase or ""), _text(body), ttl, now_ms, report)
                else:
                    self._part(key, ttl, report)

    def _run(self, key: str, phase: str, body: str, ttl: int, now_ms: int, report: GcReport) -> None:
        if phase not in {p.value for p in TERMINAL_PHASES}:
            report.live_runs += 1
            return
        ended_ms = int(float(json.loads(body).get("updated_at", 0)) * 1000)
        left_s = self.settings.retention_s - (now_ms - ended_ms) // 1000
        if self.settings.archive_url:
            # Archiving is configured: an ended run is history to keep, not garbage. The archiver
            # takes runs from their shard's ended set (and deletes their keys once archived); a run
            # that ended before the archive was configured is not in it yet.
            self._hand_to_archiver(key, ended_ms, report)
            if ttl < 0 and left_s <= 0:
                report.runs_awaiting_archive += 1
                return
        if ttl >= 0:
            report.runs_expiring += 1
            return
        parts = [key, *self._parts_of(key)]
        if left_s > 0:
            report.runs_given_ttl += 1
            if not report.dry_run:
                with self.redis.pipeline(transaction=False) as pipe:
                    for part in parts:
                        pipe.expire(part, left_s)
                    pipe.execute()
            return
        report.expired_runs += 1
        self._delete(parts, report)

    def _hand_to_archiver(self, run_key: str, ended_ms: int, report: GcReport) -> None:
        run_id = run_key[run_key.rindex(":run:") + len(":run:") :]
        ended = self.keys.ended_of(run_id)
        if report.dry_run:
            report.runs_handed_to_archiver += int(self.redis.zscore(ended, run_id) is None)
        else:
            report.runs_handed_to_archiver += int(self.redis.zadd(ended, {run_id: ended_ms}, nx=True) or 0)

    def _parts_of(self, run_key: str) -> list[str]:
        pattern = _escape(run_key) + ":*"
        return [_text(k) for k in self.redis.scan_iter(match=pattern, count=_BATCH)]

    def _part(self, key: str, ttl: int, report: GcReport) -> None:
        """A run's messages, checkpoints, events, attempts or step results: an orphan if its head is
        gone and nothing will ever expire it."""
        match = _SUFFIX.search(key)
        if match is None or ttl >= 0:
            return
        head, this = self.redis.exists(key[: match.start()]), self.redis.exists(key)
        if this and not head:  # (``this`` is gone when its run was removed earlier in this pass)
            report.orphan_keys += 1
            self._delete([key], report)

    def _delete(self, keys: list[str], report: GcReport) -> None:
        with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.memory_usage(key, samples=0)
            report.bytes_freed += sum(int(v or 0) for v in pipe.execute())
        if not report.dry_run:
            self.redis.delete(*keys)


@dataclass(frozen=True)
class MemoryState:
    """How much memory Redis uses, of how much it may."""

    used: int
    #: 0: no limit (Redis then grows until the host runs out).
    maximum: int
    policy: str

    @property
    def fraction(self) -> float:
        return self.used / self.maximum if self.maximum else 0.0

    def as_dict(self) -> dict[str, int]:
        return {"used_bytes": self.used, "maxmemory_bytes": self.maximum}


class MemoryGuard:
    """Refuses new runs while Redis is nearly full (checked at most once per ``interval_s``)."""

    def __init__(self, client: redis.Redis, settings: Settings, interval_s: float = 1.0) -> None:
        self.redis = client
        self.limit = settings.submit_max_memory
        self.interval_s = interval_s
        self._checked = -1e9
        self._state: MemoryState | None = None
        self._lock = threading.Lock()

    def state(self) -> MemoryState:
        """How full Redis is; on a cluster, its fullest primary (a run's keys all live on one)."""
        if not is_cluster(self.redis):
            return _memory(self.redis.info("memory"))
        from redis.cluster import RedisCluster

        replies: dict[str, Any] = self.redis.info("memory", target_nodes=RedisCluster.PRIMARIES)
        states = (
            [_memory(info) for info in replies.values()]
            if "used_memory" not in replies
            else [_memory(replies)]
        )
        return max(states, key=lambda state: (state.fraction, state.used))

    def fresh(self, for_s: float = 0.0) -> bool:
        """Whether :meth:`check` answers from what it read of Redis, without reading it again (and
        will for ``for_s`` seconds more)."""
        return self._state is not None and time.monotonic() - self._checked < self.interval_s - for_s

    def refresh(self) -> None:
        """Read how full Redis is now (what :meth:`check` then answers from). Takes no lock while
        it reads: a check on an event loop, which answers from a fresh reading, never waits."""
        self._state, self._checked = self._read()

    def check(self) -> None:
        """Raise :class:`StoreFull` when Redis uses its share of ``maxmemory`` or more."""
        state = self._state if self.fresh() else None
        if state is None:
            with self._lock:  # one reader at a time: the others then find it fresh
                if not self.fresh():
                    self._state, self._checked = self._read()
                state = self._state
        assert state is not None
        if state.maximum and state.fraction >= self.limit:
            raise StoreFull(full_message(state, self.limit))

    def _read(self) -> tuple[MemoryState, float]:
        now = time.monotonic()
        try:
            return self.state(), now
        except redis.ResponseError:  # INFO renamed away: nothing to go by
            return MemoryState(0, 0, ""), now


def _memory(info: dict[str, Any]) -> MemoryState:
    return MemoryState(
        used=int(info.get("used_memory", 0)),
        maximum=int(info.get("maxmemory", 0)),
        policy=str(info.get("maxmemory_policy", "")),
    )


def full_message(state: MemoryState, limit: float) -> str:
    return (
        f"Redis is full: it uses {state.used / 2**20:.1f} MiB of its maxmemory of "
        f"{state.maximum / 2**20:.1f} MiB ({state.fraction:.0%}; new runs are refused from "
        f"{limit:.0%}, {ENV_SUBMIT_MEMORY}). Runs already going finish; raise maxmemory, shorten the "
        "retention, or run `wesichain gc`, then submit again."
    )


def _batches(items: Iterator[Any]) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(_text(item[0] if isinstance(item, tuple) else item))
        if len(batch) == _BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _escape(text: str) -> str:
    """``text`` matched literally by SCAN's glob."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
