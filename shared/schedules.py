"""Schedules: cron expressions and fixed intervals that start runs of an agent, or pipeline runs.

A schedule belongs to one tenant (every key names it) and holds what each of its runs is asked
(agent, input, metadata, thread, assistant), when it fires (:class:`Timing`: a cron expression in
a time zone, or an interval in seconds from an anchor), what to do with ticks missed while no
scheduler ran (:data:`MissedPolicy`), and what to do when the previous scheduled run is still going
(:data:`OverlapPolicy`).

Exactly one run per tick, whatever the number of scheduler processes, their clocks, and their
deaths (``producer/scheduler.py`` fires the ticks; this module keeps the state):

* the schedule's next tick (``SCHED_NEXT``, whole Unix seconds) and the due set (a sorted set of
  every unpaused schedule by its next tick) are only ever moved forward by ``schedule_advance.lua``,
  a compare-and-set on the tick the caller fired: two schedulers firing the same tick advance it
  once, and the history gets one entry;
* whether a tick starts a run or is skipped (the ``skip`` overlap policy) is decided once, by the
  first ``schedule_decide.lua`` of that tick (a HSETNX); every scheduler that fires the tick again
  (after a crash, or racing) follows the recorded decision;
* the run of a tick has a deterministic id: it is submitted with the idempotency key
  :func:`tick_key`, so the second submit of a tick (a racing scheduler, or one redoing the tick of
  a scheduler that died between the submit and the advance) returns the same run;
* "now" is Redis's ``TIME``, never a scheduler host's clock, so clock skew between hosts cannot
  fire a tick early or twice;
* a tick whose decision is recorded is "in flight": it is fired to its end (its run and its history
  entry) before anything else moves the schedule. Passing over missed ticks, resuming and changing
  the timing all leave it the next tick (``schedule_advance``/``schedule_state``/``schedule_update``),
  so no tick starts a run without its entry.

A pipeline schedule (``pipeline`` instead of ``agent``) starts a pipeline run per tick, whose id
:func:`tick_pipeline_id` is deterministic as a run's is. An end date (``until``) stops a schedule
after its last tick at or before it: its next tick is then :data:`SCHED_ENDED` and it leaves the
due set.
"""

from __future__ import annotations

import json
import uuid
from collections import deque
from collections.abc import Iterator
from datetime import datetime
from typing import Any, Literal, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import redis
from croniter import CroniterBadCronError, CroniterBadDateError, croniter
from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.errors import InvalidRequest
from shared.keys import Keys
from shared.protocol import (
    SCHED_COUNTER_FAILED,
    SCHED_COUNTER_MISSED,
    SCHED_COUNTER_SKIPPED,
    SCHED_COUNTER_STARTED,
    SCHED_DECISION_PREFIX,
    SCHED_ENDED,
    SCHED_LAST_RUN,
    SCHED_NEXT,
    SCHED_PAUSED,
    SCHED_SPEC,
    SCHED_YES,
)
from shared.scripts import register_script

__all__ = [
    "HISTORY_MAX",
    "MAX_CATCH_UP",
    "MAX_CRON_CHARS",
    "MAX_FIRE_TIMES",
    "MAX_INTERVAL_S",
    "MAX_SCHEDULES_PER_TENANT",
    "MAX_TZ_CHARS",
    "MissedPolicy",
    "OverlapPolicy",
    "Schedule",
    "ScheduleStore",
    "ScheduleTick",
    "TickOutcome",
    "Timing",
    "due_plan",
    "redis_now",
    "tick_key",
    "tick_pipeline_id",
]

MissedPolicy = Literal["skip", "catch_up"]
OverlapPolicy = Literal["skip", "enqueue", "allow"]
TickOutcome = Literal["started", "skipped", "missed", "failed"]

#: Schedules one tenant may have.
MAX_SCHEDULES_PER_TENANT = 100
#: The most missed ticks ``catch_up`` starts after an outage.
MAX_CATCH_UP = 1000
#: Ticks of a schedule's history kept (the newest).
HISTORY_MAX = 50
#: Next fire times one call lists at most.
MAX_FIRE_TIMES = 100
#: The longest interval (a year) and the longest cron expression and time zone name accepted.
MAX_INTERVAL_S = 366 * 24 * 3600
MAX_CRON_CHARS = 120
MAX_TZ_CHARS = 64
#: Missed ticks counted one by one at most; an outage longer than that is reported as at least it.
_MAX_COUNTED = 100_000


def tick_key(schedule_id: str, tick: int) -> str:
    """The idempotency key of a tick's run: with the tenant, it makes the run's id (one per tick)."""
    return f"schedule:{schedule_id}:{tick}"


def tick_pipeline_id(schedule_id: str, tick: int) -> str:
    """The pipeline run id (as its tenant knows it) a pipeline schedule's tick starts."""
    return f"schedule-{schedule_id}-{tick}"


class Timing(BaseModel):
    """When a schedule fires: ``cron`` (5 fields, or 6 with seconds last) in ``timezone``, or every
    ``every_s`` seconds from ``anchor`` (Unix seconds; default: when the schedule is created).

    Ticks are whole Unix seconds. Across a daylight-saving change (cron in a zone that has one): a
    local time the clocks skip fires at the first instant after the gap (``30 2 * * *`` fires at
    03:00 on the day clocks go from 02:00 to 03:00); a local time that occurs twice fires at both
    instants, each a tick of its own with its own run. Use ``UTC`` for neither.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cron: str | None = Field(default=None, min_length=1, max_length=MAX_CRON_CHARS)
    timezone: str = Field(default="UTC", min_length=1, max_length=MAX_TZ_CHARS)
    every_s: int | None = Field(default=None, ge=1, le=MAX_INTERVAL_S)
    anchor: int | None = Field(default=None, ge=0, le=2**40)

    @model_validator(mode="after")
    def _one_kind(self) -> Timing:
        if (self.cron is None) == (self.every_s is None):
            raise ValueError("a timing is either cron (with a timezone) or every_s (with an anchor)")
        if self.cron is not None:
            if self.anchor is not None:
                raise ValueError("anchor is for intervals (every_s), not cron")
            try:
                ZoneInfo(self.timezone)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(f"unknown time zone {self.timezone!r}") from None
            if len(self.cron.split()) not in (5, 6) or not croniter.is_valid(self.cron):
                # croniter reads a seventh field (a year) too: not what the docs promise.
                raise ValueError(f"not a cron expression of 5 fields (6 with seconds): {self.cron!r}")
        elif self.timezone != "UTC":
            raise ValueError("timezone is for cron; an interval counts seconds")
        return self

    def anchored(self, now: int) -> Timing:
        """An interval without an anchor counts from ``now``; anything else is itself."""
        if self.every_s is not None and self.anchor is None:
            return self.model_copy(update={"anchor": now})
        return self

    def _cron(self, at: int) -> croniter:
        start = datetime.fromtimestamp(at, ZoneInfo(self.timezone))
        return croniter(cast(str, self.cron), start)

    def next_after(self, t: int) -> int:
        """The first tick strictly after ``t``; raises :class:`InvalidRequest` if there is none
        (a cron expression for a date that never comes, such as February 31st)."""
        if self.every_s is not None:
            anchor = self.anchor or 0
            if t < anchor:
                return anchor
            return anchor + ((t - anchor) // self.every_s + 1) * self.every_s
        try:
            return int(self._cron(t).get_next(float))
        except (CroniterBadDateError, CroniterBadCronError):
            raise InvalidRequest(f"the cron expression {self.cron!r} never fires") from None

    def at_or_before(self, t: int) -> int | None:
        """The last tick at or before ``t`` (None: none yet)."""
        if self.every_s is not None:
            anchor = self.anchor or 0
            if t < anchor:
                return None
            return anchor + (t - anchor) // self.every_s * self.every_s
        try:
            return int(self._cron(t + 1).get_prev(float))
        except (CroniterBadDateError, CroniterBadCronError):
            return None

    def ticks_from(self, first: int) -> Iterator[int]:
        """``first`` (a tick) and every tick after it."""
        tick = first
        while True:
            yield tick
            tick = self.next_after(tick)


class ScheduleTick(BaseModel):
    """One entry of a schedule's history: what one tick (or a run of missed ticks) came to."""

    model_config = ConfigDict(frozen=True)

    tick: int = Field(description="The tick's time, Unix seconds (the first of missed ticks).")
    outcome: TickOutcome = Field(
        description="started (run_id is its run), skipped (the previous run was still going),"
        " missed (``missed`` ticks passed during an outage beyond what the missed policy starts),"
        " failed (the run was refused: reason)."
    )
    run_id: str | None = None
    pipeline_id: str | None = Field(
        default=None, description="The pipeline run a pipeline schedule's tick started (its public id)."
    )
    missed: int = Field(default=0, description="How many ticks a ``missed`` entry stands for.")
    reason: str = Field(default="", max_length=300)
    at: float = Field(description="When it was recorded (Redis time, Unix seconds).")
    #: The run's status when read (filled in by the API and the client, not stored).
    status: str | None = None


class Schedule(BaseModel):
    """A schedule as the API shows it."""

    schedule_id: str
    tenant: str | None = None
    agent: str | None = Field(default=None, description="The agent each tick runs (or ``pipeline``).")
    pipeline: str | None = Field(
        default=None, description="The pipeline each tick starts a pipeline run of (or ``agent``)."
    )
    input: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    thread_id: str | None = None
    assistant: str | None = None
    timing: Timing
    missed: MissedPolicy
    catch_up: int = Field(description="Missed ticks started after an outage, at most (``skip``: 1).")
    overlap: OverlapPolicy
    until: int | None = Field(
        default=None, description="The end date, Unix seconds: no tick after it fires (None: none)."
    )
    created_at: float
    paused: bool = False
    ended: bool = Field(default=False, description="Its end date passed: it fires no more.")
    next_fire: int | None = Field(
        default=None, description="The next tick, Unix seconds (None: paused or ended)."
    )
    last_run_id: str | None = None
    last_pipeline_id: str | None = None
    started: int = 0
    skipped: int = 0
    missed_ticks: int = 0
    failed: int = 0

    @property
    def keep(self) -> int:
        """How many of a backlog of due ticks are started (the newest ones)."""
        return 1 if self.missed == "skip" else self.catch_up

    @property
    def run_thread(self) -> str | None:
        """The thread of the schedule's runs: its own, or under ``enqueue`` one per schedule
        (the runs then wait for each other, and see the earlier runs' messages)."""
        if self.thread_id is not None:
            return self.thread_id
        return f"schedule-{self.schedule_id}" if self.overlap == "enqueue" else None


#: The fields of a schedule's hash's ``SCHED_SPEC`` (changed only by :meth:`ScheduleStore.update`).
_SPEC_FIELDS = {
    "schedule_id",
    "tenant",
    "agent",
    "pipeline",
    "input",
    "metadata",
    "thread_id",
    "assistant",
    "timing",
    "missed",
    "catch_up",
    "overlap",
    "until",
    "created_at",
}
_COUNTERS: dict[TickOutcome, str] = {
    "started": SCHED_COUNTER_STARTED,
    "skipped": SCHED_COUNTER_SKIPPED,
    "missed": SCHED_COUNTER_MISSED,
    "failed": SCHED_COUNTER_FAILED,
}


def due_plan(timing: Timing, next_fire: int, now: int, keep: int) -> tuple[int, int] | None:
    """What a scheduler does with a schedule whose next tick is ``next_fire`` at ``now``.

    None: nothing is due. Otherwise ``(first, missed)``: the ticks from ``first`` to the newest due
    one are started, oldest first (at most ``keep`` of them), and the ``missed`` ticks before
    ``first`` (from ``next_fire`` on) are passed over and recorded as missed.
    """
    if next_fire > now:
        return None
    newest = timing.at_or_before(now)
    if newest is None or newest < next_fire:
        return (next_fire, 0)
    if timing.every_s is not None:
        due = (newest - next_fire) // timing.every_s + 1
        if due <= keep:
            return (next_fire, 0)
        return (newest - (keep - 1) * timing.every_s, due - keep)
    window: deque[int] = deque(maxlen=keep)
    passed = 0
    for tick in timing.ticks_from(next_fire):
        if tick > now:
            break
        if len(window) == keep:
            passed += 1
        window.append(tick)
        if passed >= _MAX_COUNTED:
            # A very long outage: the newest `keep` ticks counted back from now.
            back = [newest]
            while len(back) < keep and (earlier := timing.at_or_before(back[-1] - 1)) is not None:
                back.append(earlier)
            return (back[-1], passed)
    return (window[0], passed)


def redis_now(client: redis.Redis) -> float:
    """Redis's clock, Unix seconds: the one every scheduler agrees on."""
    seconds, micros = client.time()
    return seconds + micros / 1e6


class ScheduleStore:
    """Schedules in Redis (the keys: ``Keys.sched_*``, all under one hash tag)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys
        self._decide = register_script(client, "schedule_decide")
        self._advance = register_script(client, "schedule_advance")
        self._state = register_script(client, "schedule_state")
        self._update = register_script(client, "schedule_update")

    @staticmethod
    def member(tenant: str | None, schedule_id: str) -> str:
        """A schedule's entry in the due set."""
        return json.dumps([tenant, schedule_id])

    def create(self, schedule: Schedule) -> Schedule:
        """Write a new schedule, due at its first tick (the caller has checked it)."""
        if self.redis.zcard(self.keys.sched_index(schedule.tenant)) >= MAX_SCHEDULES_PER_TENANT:
            raise InvalidRequest(
                f"a tenant has at most {MAX_SCHEDULES_PER_TENANT} schedules: delete one first"
            )
        k, tenant, sid = self.keys, schedule.tenant, schedule.schedule_id
        assert schedule.next_fire is not None
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                k.sched(tenant, sid),
                mapping={
                    SCHED_SPEC: schedule.model_dump_json(include=_SPEC_FIELDS),
                    SCHED_NEXT: schedule.next_fire,
                },
            )
            pipe.zadd(k.sched_index(tenant), {sid: int(schedule.created_at * 1000)})
            pipe.zadd(k.sched_due(), {self.member(tenant, sid): schedule.next_fire})
            pipe.execute()
        return schedule

    def new_id(self) -> str:
        return uuid.uuid4().hex[:20]

    def load(self, tenant: str | None, schedule_id: str) -> Schedule | None:
        """The schedule, if ``tenant`` has one with this id."""
        raw = self.redis.hgetall(self.keys.sched(tenant, schedule_id))
        fields = {_s(k): _s(v) for k, v in raw.items()}
        if SCHED_SPEC not in fields:
            return None
        paused = fields.get(SCHED_PAUSED) == SCHED_YES
        ended = fields.get(SCHED_NEXT) == SCHED_ENDED
        spec = json.loads(fields[SCHED_SPEC])
        last = fields.get(SCHED_LAST_RUN)
        return Schedule(
            **spec,
            paused=paused,
            ended=ended,
            next_fire=None if paused or ended or SCHED_NEXT not in fields else int(fields[SCHED_NEXT]),
            last_run_id=None if spec.get("pipeline") else last,
            last_pipeline_id=last if spec.get("pipeline") else None,
            started=int(fields.get(SCHED_COUNTER_STARTED, 0)),
            skipped=int(fields.get(SCHED_COUNTER_SKIPPED, 0)),
            missed_ticks=int(fields.get(SCHED_COUNTER_MISSED, 0)),
            failed=int(fields.get(SCHED_COUNTER_FAILED, 0)),
        )

    def spec_of(self, tenant: str | None, schedule_id: str) -> str | None:
        """The schedule's stored spec as it is (what :meth:`update` compares), None if none."""
        raw = self.redis.hget(self.keys.sched(tenant, schedule_id), SCHED_SPEC)
        return _s(raw) if raw is not None else None

    def update(self, schedule: Schedule, expected_spec: str, next_tick: int | None) -> str:
        """Write ``schedule``'s spec if the stored one is still ``expected_spec``; with
        ``next_tick`` (0: no more ticks) its next tick too, unless a tick is in flight (then the
        tick after it). ``ok``, ``conflict`` (changed meanwhile: read again) or ``missing``."""
        k, tenant, sid = self.keys, schedule.tenant, schedule.schedule_id
        reply = self._update(
            keys=[k.sched(tenant, sid), k.sched_due()],
            args=[
                expected_spec,
                schedule.model_dump_json(include=_SPEC_FIELDS),
                "" if next_tick is None else str(next_tick),
                self.member(tenant, sid),
            ],
        )
        return _s(reply)

    def decision(self, tenant: str | None, schedule_id: str, tick: int) -> str | None:
        """The decision recorded for ``tick`` (the tick is in flight), or None."""
        raw = self.redis.hget(self.keys.sched(tenant, schedule_id), f"{SCHED_DECISION_PREFIX}{tick}")
        return _s(raw) if raw is not None else None

    def next_tick(self, tenant: str | None, schedule_id: str) -> int | None:
        """The schedule's next tick as stored (also while paused); None if there is no schedule."""
        raw = self.redis.hget(self.keys.sched(tenant, schedule_id), SCHED_NEXT)
        return int(_s(raw)) if raw is not None else None

    def list_schedules(self, tenant: str | None, limit: int = 100) -> list[Schedule]:
        """The tenant's schedules, oldest first."""
        ids = [
            _s(cast(bytes | str, i)) for i in self.redis.zrange(self.keys.sched_index(tenant), 0, limit - 1)
        ]
        found = [self.load(tenant, sid) for sid in ids]
        return [s for s in found if s is not None]

    def history(self, tenant: str | None, schedule_id: str, limit: int = HISTORY_MAX) -> list[ScheduleTick]:
        """The schedule's newest ticks, newest first."""
        raw = self.redis.lrange(self.keys.sched_history(tenant, schedule_id), -limit, -1)
        return [ScheduleTick.model_validate_json(entry) for entry in reversed(raw)]

    def delete(self, tenant: str | None, schedule_id: str) -> bool:
        """Delete the schedule and its history; False if there was none. Its runs go on."""
        k = self.keys
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(k.sched(tenant, schedule_id), k.sched_history(tenant, schedule_id))
            pipe.zrem(k.sched_index(tenant), schedule_id)
            pipe.zrem(k.sched_due(), self.member(tenant, schedule_id))
            deleted = pipe.execute()
        return bool(deleted[0])

    def pause(self, tenant: str | None, schedule_id: str) -> bool:
        """Stop firing (a tick being fired right now may still start its run); False: no schedule."""
        k = self.keys
        reply = self._state(
            keys=[k.sched(tenant, schedule_id), k.sched_due()],
            args=["pause", self.member(tenant, schedule_id), 0],
        )
        return _s(reply) != "missing"

    def resume(self, tenant: str | None, schedule_id: str, next_fire: int) -> bool:
        """Fire again from ``next_fire`` (ticks that passed while paused are not started)."""
        k = self.keys
        reply = self._state(
            keys=[k.sched(tenant, schedule_id), k.sched_due()],
            args=["resume", self.member(tenant, schedule_id), next_fire],
        )
        return _s(reply) != "missing"

    # -- firing (producer/scheduler.py) ------------------------------------------------------------

    def due(self, now: int, limit: int = 500) -> list[tuple[str | None, str]]:
        """(tenant, schedule id) of schedules whose next tick is at or before ``now``, oldest first."""
        raw = self.redis.zrangebyscore(self.keys.sched_due(), "-inf", now, start=0, num=limit)
        out: list[tuple[str | None, str]] = []
        for member in raw:
            tenant, schedule_id = json.loads(_s(cast(bytes | str, member)))
            out.append((tenant, schedule_id))
        return out

    def forget_due(self, tenant: str | None, schedule_id: str) -> None:
        """Drop a due entry whose schedule is gone (deleted while it was being fired)."""
        if not self.redis.exists(self.keys.sched(tenant, schedule_id)):
            self.redis.zrem(self.keys.sched_due(), self.member(tenant, schedule_id))

    def decide(self, tenant: str | None, schedule_id: str, tick: int, decision: str) -> str | None:
        """Record ``decision`` (``run`` or ``skip``) for ``tick`` unless one was recorded first;
        the decision that holds, or None if ``tick`` is no longer the schedule's next (fired
        already, paused, deleted)."""
        reply = self._decide(keys=[self.keys.sched(tenant, schedule_id)], args=[tick, decision])
        status, *rest = [_s(part) for part in reply]
        return rest[0] if status == "ok" else None

    def advance(
        self,
        tenant: str | None,
        schedule_id: str,
        tick: int,
        next_tick: int,
        entry: ScheduleTick,
        decision: str = "",
    ) -> bool:
        """Move the schedule from ``tick`` on to ``next_tick`` (0: it ended) and record ``entry``,
        once: False if another scheduler did it first (or the schedule was paused, resumed or
        deleted). ``decision`` is the one the caller followed (none for missed ticks): a tick
        whose recorded decision is another is left to whoever follows that one."""
        k = self.keys
        count = entry.missed if entry.outcome == "missed" else 1
        started = entry.run_id or entry.pipeline_id or ""
        reply = self._advance(
            keys=[k.sched(tenant, schedule_id), k.sched_history(tenant, schedule_id), k.sched_due()],
            args=[
                tick,
                next_tick,
                entry.model_dump_json(exclude={"status"}),
                _COUNTERS[entry.outcome],
                count,
                started,
                self.member(tenant, schedule_id),
                HISTORY_MAX,
                decision,
            ],
        )
        return int(reply) == 1


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
