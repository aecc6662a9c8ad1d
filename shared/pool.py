"""The pool as its operators watch it: live workers, queue depths, leases, parked runs, runs ended
per minute, and the workers liveness declared dead.

Two records are written for it, both bounded, and nothing else: the runs ended per minute
(:class:`~shared.pool_records.Throughput`) and the worker starts liveness declared dead
(:class:`~shared.pool_records.Obituaries`), in ``shared/pool_records.py``, which the workers
import without this module.

Everything else is read when asked, from what the runtime already keeps (the registry, the
broker's lists, the shards' lease and index sets, the threads' waiting lists, the pinned runs).
:func:`pool_view` reads it for one caller: the operator sees the whole pool; a tenant sees
aggregate counts of the pool and only its own runs (no worker hosts, no other tenant's run ids,
no queue but the default ones).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, Literal

import redis
from pydantic import BaseModel, Field

from shared.keys import Keys
from shared.pool_records import ENDED_STATUSES, MinuteCount, Obituaries, Throughput, WorkerDeath
from shared.queues import namespace_queues
from shared.settings import QUEUE_CALLBACKS, QUEUE_MODEL, QUEUE_TOOLS, Settings
from shared.state import Phase, status_of
from shared.store import RunStore
from shared.tenants import Tenants
from shared.timeline import Marker, Timeline
from shared.versions import PinnedRuns, version_loads, waiting_loads
from shared.workers import LiveWorker

__all__ = [
    "DEATH_GRACE_S",
    "TAKEOVER_AFTER_DEATH_S",
    "DEFAULT_QUEUES",
    "MAX_EXTRA_QUEUES",
    "MAX_PARKED_READ",
    "MAX_RUNS_IN_FLIGHT",
    "MAX_THREADS_READ",
    "PRIORITY_STEPS",
    "DeathView",
    "ParkedCounts",
    "PoolView",
    "QueueDepth",
    "RunInFlight",
    "WorkerView",
    "death_markers",
    "known_queues",
    "pool_view",
    "with_deaths",
]

DEFAULT_QUEUES = (QUEUE_MODEL, QUEUE_TOOLS, QUEUE_CALLBACKS)
#: Queues beyond the default ones whose depth is read (those live workers consume).
MAX_EXTRA_QUEUES = 64
#: kombu's Redis transport keeps a list per priority step (``queue``, ``queue\x06\x163``, ...).
PRIORITY_STEPS = (0, 3, 6, 9)
_PRIORITY_SEP = "\x06\x16"

#: How long after a run ended a death that held one of its claims may be recorded (its liveness
#: ran out after the claim's lease had handed the run on): well past any lease and sweep.
DEATH_GRACE_S = 120.0
#: How soon after a worker's liveness ran out a takeover is taken to be of a claim it held.
TAKEOVER_AFTER_DEATH_S = 30.0

#: A tenant's runs listed as in flight, newest first.
MAX_RUNS_IN_FLIGHT = 20
#: Parked runs whose heads are read to tell a human's decision from subagents.
MAX_PARKED_READ = 500
#: Threads looked at for runs waiting for the run before them.
MAX_THREADS_READ = 1000


def known_queues(live: Sequence[LiveWorker], namespaces: Sequence[str] = ()) -> list[str]:
    """The default queues, those live workers consume besides (a namespace's, a version's), and
    those of ``namespaces`` (which tenants may send runs to, consumed or not): at most
    ``MAX_EXTRA_QUEUES`` besides the default ones."""
    consumed = {q for w in live for q in w.record.queues}
    allowed = {q for ns in namespaces for q in namespace_queues(ns)}
    extra = sorted((consumed | allowed) - set(DEFAULT_QUEUES))
    return [*DEFAULT_QUEUES, *extra[:MAX_EXTRA_QUEUES]]


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def death_markers(
    run_id: str, deaths: Sequence[WorkerDeath], lanes: Sequence[str] = (), takeovers: Sequence[float] = ()
) -> list[Marker]:
    """A "worker died" marker for each death that held a claim of ``run_id``, on the lane of the
    pool process that held it (no lane when that process was not known yet); or, for a death that
    names no claim of the run, on each of the run's ``lanes`` that is one of its processes; or, for
    one that names neither (a claim taken after its last listing, whose last-claim record expired
    with the lease), across the timeline when one of the run's ``takeovers`` (claim times of
    phases taken over from a dead delivery) came within :data:`TAKEOVER_AFTER_DEATH_S` after it.
    The last is inferred from timing, and says so."""
    markers = []
    for death in deaths:
        holders = sorted({holder for claimed, holder in death.claims if claimed == run_id})
        for holder in holders:
            lane = holder if "," not in holder else None
            text = (
                f"worker {death.life} died (its liveness ran out): the claim its process {holder}"
                " held was handed on"
            )
            markers.append(Marker(at=death.at, kind="worker_died", text=text, lane=lane))
        if holders:
            continue
        touched = sorted(set(lanes) & set(death.processes))
        for lane in touched:
            text = f"worker {death.life} died (its liveness ran out): its process {lane} ran part of this run"
            markers.append(Marker(at=death.at, kind="worker_died", text=text, lane=lane))
        if not touched and any(death.at <= t <= death.at + TAKEOVER_AFTER_DEATH_S for t in takeovers):
            text = (
                f"worker {death.life} died (its liveness ran out) just before a phase of this run"
                " was taken over from a dead delivery"
            )
            markers.append(Marker(at=death.at, kind="worker_died", text=text, lane=None))
    return markers


# -- the view ------------------------------------------------------------------------------------


class WorkerView(BaseModel):
    """A live worker as the operator view shows it."""

    id: str
    host: str
    pid: int
    queues: list[str]
    pool: str
    concurrency: int
    busy: int = Field(description="Slots running a task at its last heartbeat.")
    agents: list[str] = Field(description="``name vVERSION`` of each agent it serves.")
    consuming: bool
    consumer_state: str
    draining: bool
    started_at: float
    heartbeat_age_s: float = Field(description="Seconds since its last heartbeat, by Redis's clock.")


class QueueDepth(BaseModel):
    queue: str
    depth: int | None = Field(description="Messages waiting; null when the broker is not readable here.")


class ParkedCounts(BaseModel):
    """Runs holding no worker until something else moves them."""

    approval: int = Field(description="Awaiting a human's decision (status awaiting_approval).")
    subagents: int = Field(description="Of those, waiting for their subagents' runs instead.")
    thread: int = Field(description="Queued behind the run before them in their thread.")
    version: int = Field(description="Queued or running, pinned to an agent version no live worker serves.")
    partial: bool = Field(description="True when a bound stopped a count short (see docs/api.md).")


class RunInFlight(BaseModel):
    """One of the caller's runs that holds (or waits for) a worker."""

    run_id: str
    agent: str
    status: str
    lease_due_in_s: float | None = Field(
        description="Seconds until the sweeper looks at the run (its lease or queued time); null: none."
    )


class DeathView(BaseModel):
    worker: str
    at: float
    claims: int = Field(description="Claims it held, handed on to other workers.")


class PoolView(BaseModel):
    """The pool as one caller may see it (``GET /v1/pool``)."""

    scope: Literal["operator", "tenant"] = Field(
        description="operator: the whole pool; tenant: pool-wide counts and the caller's own runs."
    )
    generated_at: float
    workers: list[WorkerView] = Field(description="Live workers (operator scope only; empty for a tenant).")
    worker_count: int
    consuming_workers: int
    slots: int = Field(description="Slots (concurrency) of the live workers, summed.")
    slots_in_use: int
    broker: Literal["redis", "rabbitmq"]
    queues: list[QueueDepth] = Field(description="Operator: every known queue; tenant: the default ones.")
    in_flight: int = Field(description="Runs not ended (the scope's).")
    leases: int = Field(description="Runs the sweeper watches (the scope's): their lease or queued time.")
    leases_due: int | None = Field(description="Of those, due by Redis's clock (operator scope only).")
    running: list[RunInFlight] = Field(
        description="The caller's own newest queued or running runs (never another tenant's)."
    )
    parked: ParkedCounts
    deaths: list[DeathView] = Field(description="Recent dead worker starts (operator scope only).")
    throughput: list[MinuteCount] = Field(description="Runs ended per minute (the scope's), oldest first.")


def _worker_view(worker: LiveWorker) -> WorkerView:
    r = worker.record
    return WorkerView(
        id=r.id,
        host=r.host,
        pid=r.pid,
        queues=r.queues,
        pool=r.pool,
        concurrency=r.concurrency,
        busy=r.busy,
        agents=[f"{a.name} v{a.version}" for a in r.agents],
        consuming=r.consuming,
        consumer_state=r.consumer_state,
        draining=r.draining,
        started_at=r.started_at,
        heartbeat_age_s=round(worker.age_s, 3),
    )


def pool_view(
    store: RunStore,
    settings: Settings,
    live: Sequence[LiveWorker],
    tenant: str | None,
    operator: bool,
    minutes: int = 60,
) -> PoolView:
    """What ``tenant`` may see of the pool (all of it when ``operator``); ``minutes`` of throughput."""
    r, keys = store.redis, store.keys
    shards = range(keys.shards)
    now_ms = _redis_ms(r)
    redis_broker = settings.broker_is_redis
    # The broker's lists are readable here when the broker is the run state's own Redis.
    depths_readable = redis_broker and not settings.broker_url
    tenants: list[str | None]
    if operator:
        names = sorted(_text(t) for t in r.smembers(keys.tenants()))
        tenants = [None, *names]
        registry = Tenants(r, keys)
        namespaces = sorted({ns for name in names for ns in registry.namespaces(name)})
        queues = known_queues(live, namespaces)
    else:
        tenants = [tenant]
        queues = list(DEFAULT_QUEUES)
    with r.pipeline(transaction=False) as pipe:
        if depths_readable:
            for queue in queues:
                for step in PRIORITY_STEPS:
                    pipe.llen(
                        settings.broker_prefix + (queue if step == 0 else f"{queue}{_PRIORITY_SEP}{step}")
                    )
        for shard in shards:
            pipe.hgetall(keys.inflight(shard))
            if operator:
                pipe.zcard(keys.leases(shard))
                pipe.zcount(keys.leases(shard), "-inf", now_ms)
            for t in tenants:
                pipe.zcard(keys.index(shard, t, "status", "awaiting_approval"))
        replies = iter(pipe.execute())
    depths = [
        QueueDepth(
            queue=q, depth=sum(int(next(replies)) for _ in PRIORITY_STEPS) if depths_readable else None
        )
        for q in queues
    ]
    in_flight = leases = due = approval = 0
    for _ in shards:
        for who, count in next(replies).items():
            if operator or _text(who) == (tenant or "-"):
                in_flight += int(count)
        if operator:
            leases += int(next(replies))
            due += int(next(replies))
        approval += sum(int(next(replies)) for _ in tenants)

    # The caller's own runs only, whoever calls: run ids are never shown across tenants.
    running, running_total = _runs_in_flight(store, tenant, now_ms)
    if not operator:
        leases = running_total
    deaths = (
        [DeathView(worker=d.life, at=d.at, claims=len(d.claims)) for d in Obituaries(r, keys).recent(20)]
        if operator
        else []
    )
    return PoolView(
        scope="operator" if operator else "tenant",
        generated_at=now_ms / 1000,
        workers=[_worker_view(w) for w in live] if operator else [],
        worker_count=len(live),
        consuming_workers=sum(1 for w in live if w.record.consuming),
        slots=sum(w.record.concurrency for w in live),
        slots_in_use=sum(w.record.busy for w in live),
        broker="redis" if redis_broker else "rabbitmq",
        queues=depths,
        in_flight=in_flight,
        leases=leases,
        leases_due=due if operator else None,
        running=running,
        parked=_parked(store, live, tenants, approval, operator),
        deaths=deaths,
        throughput=Throughput(r, keys).series("*" if operator else tenant, minutes, time.time()),
    )


def _parked(
    store: RunStore, live: Sequence[LiveWorker], tenants: Sequence[str | None], approval: int, operator: bool
) -> ParkedCounts:
    subagents, partial = _parked_for_subagents(store, tenants)
    tenant = None if operator else tenants[0]
    thread_waits, threads_partial = _thread_waits(store.redis, store.keys, tenant, operator)
    pinned = PinnedRuns(store)
    if operator:
        version_waits = sum(v.active for v in waiting_loads(pinned, live))
    else:
        version_waits = sum(v.active for v in version_loads(pinned, live, tenant) if v.waiting)
    return ParkedCounts(
        approval=approval,
        subagents=subagents,
        thread=thread_waits,
        version=version_waits,
        partial=partial or threads_partial,
    )


def _runs_in_flight(store: RunStore, tenant: str | None, now_ms: int) -> tuple[list[RunInFlight], int]:
    """The tenant's newest queued or running runs (at most ``MAX_RUNS_IN_FLIGHT``), and how many
    of them are running (what its leases are)."""
    r, keys = store.redis, store.keys
    shards = range(keys.shards)
    newest: list[tuple[float, str]] = []
    total = 0
    with r.pipeline(transaction=False) as pipe:
        for shard in shards:
            for status in ("running", "queued"):
                key = keys.index(shard, tenant, "status", status)
                pipe.zcard(key)
                pipe.zrevrange(key, 0, MAX_RUNS_IN_FLIGHT - 1, withscores=True)
        replies = iter(pipe.execute())
    for _ in shards:
        for status in ("running", "queued"):
            count = int(next(replies))
            if status == "running":
                total += count
            newest.extend((float(score), _text(member)) for member, score in next(replies))
    newest.sort(reverse=True)
    chosen = [run_id for _, run_id in newest[:MAX_RUNS_IN_FLIGHT]]
    found = []
    with r.pipeline(transaction=False) as pipe:
        for run_id in chosen:
            pipe.zscore(keys.leases_of(run_id), run_id)
        scores = pipe.execute()
    for run_id, score in zip(chosen, scores, strict=True):
        head = store.load(run_id)
        if head is None or head.tenant != tenant or head.terminal:
            continue
        due_in = None if score is None else round((float(score) - now_ms) / 1000, 3)
        found.append(
            RunInFlight(run_id=run_id, agent=head.agent, status=status_of(head.phase), lease_due_in_s=due_in)
        )
    return found, total


def _parked_for_subagents(store: RunStore, tenants: Sequence[str | None]) -> tuple[int, bool]:
    """Of the parked runs of ``tenants``, those waiting for subagents (at most ``MAX_PARKED_READ``
    heads read: True when that stopped the count short)."""
    r, keys = store.redis, store.keys
    ids: list[str] = []
    with r.pipeline(transaction=False) as pipe:
        for shard in range(keys.shards):
            for t in tenants:
                pipe.zrevrange(keys.index(shard, t, "status", "awaiting_approval"), 0, MAX_PARKED_READ)
        for members in pipe.execute():
            ids.extend(_text(m) for m in members)
    partial = len(ids) > MAX_PARKED_READ
    count = 0
    for run_id in ids[:MAX_PARKED_READ]:
        head = store.load(run_id)
        if (
            head is not None
            and head.phase is Phase.AWAITING_APPROVAL
            and head.approval is not None
            and head.approval.kind == "children"
        ):
            count += 1
    return count, partial


def _thread_waits(r: redis.Redis, keys: Keys, tenant: str | None, operator: bool) -> tuple[int, bool]:
    """Runs queued behind the run before them in a thread held by some run (of ``tenant`` unless
    ``operator``); at most ``MAX_THREADS_READ`` threads looked at (True when that stopped it)."""
    threads: list[tuple[str | None, str]] = []
    partial = False
    for member, _ in r.zscan_iter(keys.threads_held(), count=200):
        try:
            owner, thread_id = json.loads(_text(member))
        except (ValueError, TypeError):
            continue
        owner = owner if owner not in ("", "-") else None
        if not operator and owner != tenant:
            continue
        if len(threads) >= MAX_THREADS_READ:
            partial = True
            break
        threads.append((owner, str(thread_id)))
    if not threads:
        return 0, partial
    with r.pipeline(transaction=False) as pipe:
        for owner, thread_id in threads:
            pipe.llen(keys.thread_waiting(owner, thread_id))
        return sum(int(n) for n in pipe.execute()), partial


def with_deaths(timeline: Timeline, obituaries: Obituaries, now_s: float) -> Timeline:
    """``timeline`` with a "worker died" marker for each recorded death that held one of its claims
    (deaths from the run's start to its end, or to now while it has not ended; and up to
    :data:`DEATH_GRACE_S` past its end: a claim's lease can hand the run on, and the run end, before
    the dead worker's liveness runs out, which is the time its death is recorded at)."""
    until = timeline.end + DEATH_GRACE_S if timeline.status in ENDED_STATUSES else max(timeline.end, now_s)
    takeovers = [m.at for m in timeline.markers if m.kind == "takeover"]
    deaths = obituaries.between(timeline.start - 1, until + 1)
    markers = death_markers(timeline.run_id, deaths, timeline.lanes, takeovers)
    if not markers:
        return timeline
    return timeline.model_copy(update={"markers": sorted([*timeline.markers, *markers], key=lambda m: m.at)})
