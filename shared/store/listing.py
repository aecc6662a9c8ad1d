"""Listing runs from the indexes the scripts keep (never a key scan), cursors, and threads.

A listing (a search: ``shared/search.py``) reads one index per shard, merges the shards by creation
time and, with an archive, merges the archive's runs in by the same order, so one cursor pages
through both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from shared.errors import InvalidRequest
from shared.state import RunHead
from shared.store.base import _s
from shared.store.runs import RunsMixin

if TYPE_CHECKING:
    from shared.search import SearchQuery

__all__ = [
    "CURSOR_PATTERN",
    "ListingMixin",
    "RunPage",
    "inflight_total",
]


@dataclass(frozen=True)
class RunPage:
    """One page of a listing, newest first; ``next_cursor`` continues it (None: nothing older)."""

    runs: list[RunHead]
    next_cursor: str | None


#: Index entries read per shard and round of a listing.
_LIST_BATCH = 64


class ListingMixin(RunsMixin):
    """Listings, the indexes behind them, and threads."""

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
        """A tenant's runs, newest first: :meth:`search_runs` with these filters only."""
        # Loaded by the first listing: the search's models are the API's and the client's (a
        # worker lists runs only for a bulk job), so a worker does not carry them.
        from shared.search import SearchQuery

        # Unvalidated: a status no run has lists nothing, as it always did.
        query = SearchQuery.model_construct(
            agent=agent, status=cast(Any, status), thread_id=thread_id, since=since, metadata={}
        )
        return self.search_runs(tenant, query, cursor=cursor, limit=limit, max_scan=max_scan)

    def search_runs(
        self,
        tenant: str | None,
        query: SearchQuery,
        *,
        cursor: str | None = None,
        limit: int = 50,
        max_scan: int = 2000,
    ) -> RunPage:
        """A tenant's runs that match ``query``, newest first, from the indexes the scripts keep
        (never a key scan).

        One index is read (the query's narrowest: ``SearchQuery.primary_index``), merged across the
        shards by creation time and bounded by the query's time range; its other filters are applied
        to the runs read. At most ``max_scan`` index entries are read per page, so a page may hold
        fewer than ``limit`` runs and still have a ``next_cursor``. With an archive, its matching
        runs are merged in by the same order (creation ms, run id), so one cursor pages through
        both. Metadata keys are not checked against the declared ones here (the callers do).
        """
        position = _parse_cursor(cursor)
        until = query.until_ms
        if until is not None and (position is None or position > (until, "")):
            # (until, "") sorts above every run of that millisecond: "before until" exactly.
            position = (until, "")
        live, stop = self._search_redis(tenant, query, position, limit, max_scan)
        archive = self.archive
        if archive is None:
            return _page(live, limit, stop)
        from shared.archive import ListingFilter

        where = ListingFilter(
            tenant,
            agent=query.agent,
            status=query.status,
            thread_id=query.thread_id,
            since_ms=query.since_ms,
            version=query.version,
            error_kind=query.error_kind,
            metadata=query.metadata,
        )
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

    def _search_redis(
        self,
        tenant: str | None,
        query: SearchQuery,
        position: tuple[int, str] | None,
        limit: int,
        max_scan: int,
    ) -> tuple[list[tuple[int, RunHead]], tuple[int, str] | None]:
        """Up to ``limit`` matching runs in Redis below ``position`` (with their creation ms), and
        where the reading stopped when there may be more (None: nothing older is left)."""
        k = self.keys
        dimension, value = query.primary_index()
        floor = query.since_ms
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
                if query.matches(head):
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

    def queue_inflight(self, pipe: Any, tenant: str | None) -> int:
        """Queue :meth:`inflight`'s reads on the pipeline ``pipe``, to share a round trip with other
        commands; returns how many replies they take (sum them with :func:`inflight_total`)."""
        for shard in range(self.keys.shards):
            pipe.hget(self.keys.inflight(shard), tenant or "-")
        return self.keys.shards

    def join_thread(self, tenant: str | None, thread_id: str, run_id: str) -> list[str]:
        """Add ``run_id`` to its tenant's thread (once, atomically); the thread's run ids, oldest first."""
        key = self.keys.thread(tenant, thread_id)
        reply = self._run("join_thread", [key], [run_id, self.settings.retention_s])
        ids = [_s(r) for r in reply]
        if ids == [run_id] and (archive := self.archive) is not None:
            # The thread's list expired with the retention; its earlier runs are in the archive.
            ids = [*(r for r in archive.thread_runs(tenant, thread_id) if r != run_id), run_id]
        return ids


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


def inflight_total(replies: list[Any]) -> int:
    """The runs in flight, from the replies of :meth:`ListingMixin.queue_inflight`'s reads."""
    return sum(int(v or 0) for v in replies)
