"""The two records the pool's view reads (``shared/pool.py``), written by the workers, both bounded.

* :class:`Throughput`: per-minute counters of the runs that ended, by status, for the whole pool
  and per tenant (a hash per minute, kept :data:`THROUGHPUT_KEEP_S`). The worker process that
  commits a run's end increments them right after that commit: a run's end commits once, so it is
  counted at most once; a worker killed between the commit and the increment leaves it uncounted.
* :class:`Obituaries`: each worker start the sweeper found dead (its liveness record ran out, see
  ``shared/liveness.py``), when it died by Redis's clock, and which claims it held then (a sorted
  set of at most :data:`MAX_DEATHS` entries, kept :data:`DEATHS_KEEP_S`). A run's timeline shows
  a "worker died" marker for each death that held one of its claims.

They live apart from the view because every worker writes them (the pool processes count ends,
the sweeper records deaths) while only the API and the client read the view: a worker imports
this module and not the view's models, the timeline, the tenants or the versions' loads.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

import redis
from pydantic import BaseModel, Field

from shared.keys import Keys
from shared.liveness import DeadStart, HeldClaim
from shared.state import RunHead, status_of

__all__ = [
    "DEATHS_KEEP_S",
    "ENDED_STATUSES",
    "MAX_CLAIMS_PER_DEATH",
    "MAX_DEATHS",
    "MAX_SERIES_MINUTES",
    "THROUGHPUT_KEEP_S",
    "MinuteCount",
    "Obituaries",
    "Throughput",
    "WorkerDeath",
]

#: How long the per-minute counters of ended runs are kept.
THROUGHPUT_KEEP_S = 24 * 3600
#: The longest series one read returns (the whole kept window).
MAX_SERIES_MINUTES = THROUGHPUT_KEEP_S // 60
#: The statuses of a run's end, each counted per minute.
ENDED_STATUSES = ("completed", "failed", "interrupted")

#: Dead worker starts remembered (the oldest are dropped past it), and for how long.
MAX_DEATHS = 500
DEATHS_KEEP_S = 24 * 3600
#: Claims remembered per dead start (a start holds at most its pool's slots, usually a few).
MAX_CLAIMS_PER_DEATH = 256


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


# -- runs ended per minute ---------------------------------------------------------------------


class MinuteCount(BaseModel):
    """Runs that ended in one minute (of the committing worker's clock)."""

    minute: int = Field(description="The minute's start, Unix seconds.")
    completed: int = 0
    failed: int = 0
    interrupted: int = 0


class Throughput:
    """Per-minute counters of ended runs: ``*:<status>`` for the pool, ``t:<tenant>:<status>``."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys

    @staticmethod
    def _field(tenant: str | None, status: str) -> str:
        return f"t:{tenant or '-'}:{status}"

    def record(self, head: RunHead) -> None:
        """``head`` is a run's end, just committed by this process."""
        status = status_of(head.phase)
        if status not in ENDED_STATUSES:
            return
        key = self.keys.ends_per_minute(int(head.updated_at // 60) * 60)
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hincrby(key, f"*:{status}", 1)
            pipe.hincrby(key, self._field(head.tenant, status), 1)
            pipe.expire(key, THROUGHPUT_KEEP_S + 120)
            pipe.execute()

    def series(self, tenant: str | None | Literal["*"], minutes: int, now_s: float) -> list[MinuteCount]:
        """The last ``minutes`` minutes up to ``now_s``, oldest first, of ``tenant`` (``"*"``: all)."""
        minutes = max(1, min(minutes, MAX_SERIES_MINUTES))
        last = int(now_s // 60) * 60
        starts = [last - 60 * i for i in range(minutes - 1, -1, -1)]
        fields = [f"*:{s}" if tenant == "*" else self._field(tenant, s) for s in ENDED_STATUSES]
        with self.redis.pipeline(transaction=False) as pipe:
            for start in starts:
                pipe.hmget(self.keys.ends_per_minute(start), fields)
            replies = pipe.execute()
        series = []
        for start, values in zip(starts, replies, strict=True):
            counts = [int(v) if v is not None else 0 for v in values]
            series.append(MinuteCount(minute=start, **dict(zip(ENDED_STATUSES, counts, strict=True))))
        return series


# -- dead workers --------------------------------------------------------------------------------


class WorkerDeath(BaseModel):
    """A worker start liveness declared dead, and what it held then."""

    life: str = Field(description="The worker start (``host:pid:token`` of its main process).")
    at: float = Field(description="When its liveness ran out, Unix seconds by Redis's clock.")
    #: ``[run_id, holder]`` of each claim it held (the holder: ``host:pid`` of the pool process,
    #: or several, comma-separated, when the claim was received but not yet known to be accepted).
    claims: list[tuple[str, str]] = Field(default_factory=list)
    #: Its processes (``host:pid``: the main one and its pool's): a run whose timeline has a lane of
    #: one of them was touched by the dead worker, even when the claim it held had already been
    #: handed on by its lease when the death was recorded.
    processes: list[str] = Field(default_factory=list)


class Obituaries:
    """The worker starts the sweeper found dead, newest last (a bounded sorted set)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys

    def record(self, dead: DeadStart, claims: Sequence[HeldClaim] | None = None) -> None:
        """``dead`` with the claims it held: ``claims`` when given (the start's listed claims and
        its processes' last claims, taken after its last beat), else the listed ones."""
        held = dead.held if claims is None else claims
        death = WorkerDeath(
            life=dead.life,
            at=dead.until_ms / 1000,
            claims=[(c.run_id, c.holder) for c in held[:MAX_CLAIMS_PER_DEATH]],
            processes=[":".join(dead.life.split(":")[:2]), *dead.pool[:MAX_CLAIMS_PER_DEATH]],
        )
        key = self.keys.worker_deaths()
        horizon = dead.until_ms - DEATHS_KEEP_S * 1000
        with self.redis.pipeline(transaction=False) as pipe:
            # The same death recorded twice (a sweep retried) is one member: JSON of equal content.
            pipe.zadd(key, {death.model_dump_json(): dead.until_ms})
            pipe.zremrangebyscore(key, "-inf", horizon)
            pipe.zremrangebyrank(key, 0, -MAX_DEATHS - 1)
            pipe.execute()

    def between(self, since_s: float, until_s: float, limit: int = MAX_DEATHS) -> list[WorkerDeath]:
        """Deaths from ``since_s`` to ``until_s`` (Unix seconds), oldest first."""
        raw: list[Any] = self.redis.zrangebyscore(
            self.keys.worker_deaths(), int(since_s * 1000), int(until_s * 1000), start=0, num=limit
        )
        return [WorkerDeath.model_validate(json.loads(_text(member))) for member in raw]

    def recent(self, limit: int = 50) -> list[WorkerDeath]:
        """The newest ``limit`` deaths, newest first."""
        raw: list[Any] = self.redis.zrevrange(self.keys.worker_deaths(), 0, limit - 1)
        return [WorkerDeath.model_validate(json.loads(_text(member))) for member in raw]
