"""Bulk jobs: one action (retry, fork, cancel) on every run a search finds, as a durable job.

A job is created with its search frozen at its creation time (``SearchQuery.frozen_at``: only the
runs created before it, so the runs it creates never match it), and is worked by the pool's
``wesichain.bulk.run`` task a chunk at a time (``worker/bulk.py``):

* the job's hash holds its spec, status, counters and the search cursor of the next chunk; the
  cursor moves on only once every run of the chunk is recorded;
* each run's outcome is recorded once (``bulk_record.lua``: HSETNX into the job's outcomes, then
  the matching counter), and a run recorded already is passed over: a chunk redone after its
  worker died acts on none of its runs twice;
* a retry is a submit with an idempotency key derived from (job, run), a fork a new run whose id
  is derived from them: a run acted on but not recorded before a crash is found again, not made
  twice; a cancel is idempotent as it is;
* one delivery works on a job at a time (a lock with a lease, renewed per run); the sweeper sends
  the task again for a running job that nobody holds and whose last task is overdue.

Every key of a job names its tenant: a job is found only with its own tenant.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Literal, cast

import redis
from pydantic import BaseModel, ConfigDict, Field

from shared.errors import InvalidRequest
from shared.keys import Keys
from shared.scripts import register_script
from shared.search import SearchQuery
from shared.state import TaskSpec
from shared.tasks import TASK_BULK

__all__ = [
    "BULK_ACTIONS",
    "BulkAction",
    "BulkJob",
    "BulkOutcome",
    "BulkStatus",
    "BulkStore",
    "DEFAULT_RATE_PER_S",
    "JOB_RETENTION_S",
    "MAX_JOBS_PER_TENANT",
    "MAX_RATE_PER_S",
    "MAX_RUNNING_PER_TENANT",
    "MIN_RATE_PER_S",
    "bulk_task",
]

BulkAction = Literal["retry", "fork", "cancel"]
BULK_ACTIONS: tuple[BulkAction, ...] = ("retry", "fork", "cancel")
BulkStatus = Literal["running", "done", "cancelled"]

#: Runs acted on per second, by default and at most (at least: one every five seconds).
DEFAULT_RATE_PER_S = 5.0
MAX_RATE_PER_S = 100.0
MIN_RATE_PER_S = 0.2
#: Jobs of one tenant kept (the oldest ended ones are dropped past it) and running at once.
MAX_JOBS_PER_TENANT = 200
MAX_RUNNING_PER_TENANT = 10
#: How long an ended job is kept.
JOB_RETENTION_S = 7 * 24 * 3600

#: The fields of a job that never change (its hash's ``spec``).
_SPEC_FIELDS = {"job_id", "tenant", "action", "query", "rate_per_s", "created_at"}
_COUNTERS = {"acted": "n_acted", "skipped": "n_skipped", "failed": "n_failed"}


class BulkOutcome(BaseModel):
    """What a job did to one run."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    #: ``acted``: retried, forked or cancelled; ``skipped``: not a run the action applies to
    #: (``reason`` says why); ``failed``: the action was refused (``reason``).
    result: Literal["acted", "skipped", "failed"]
    #: The run a retry or a fork created.
    new_run_id: str | None = None
    reason: str = Field(default="", max_length=300)


class BulkJob(BaseModel):
    """A bulk job as the API shows it: what it does, to which runs, and how far it got."""

    job_id: str
    tenant: str | None = None
    action: BulkAction
    #: The search it acts on, bounded to the runs created before the job (``until``).
    query: SearchQuery
    rate_per_s: float
    status: BulkStatus
    #: Runs acted on, passed over and refused so far.
    acted: int = 0
    skipped: int = 0
    failed: int = 0
    created_at: float
    updated_at: float
    finished_at: float | None = None

    @property
    def done(self) -> int:
        return self.acted + self.skipped + self.failed


def bulk_task(tenant: str | None, job_id: str, *, countdown: float = 0.0) -> TaskSpec:
    """The task that works the next chunk of a job (its arguments name it; nothing else)."""
    return TaskSpec(
        name=TASK_BULK,
        task_id=f"bulk:{job_id}:{uuid.uuid4().hex[:12]}",
        arguments={"tenant": tenant, "job_id": job_id},
        countdown=countdown,
    )


class BulkStore:
    """Bulk jobs in Redis (the keys: ``Keys.bulk_*``)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys
        self._record = register_script(client, "bulk_record")
        self._lock = register_script(client, "lock")

    # -- creating and reading ----------------------------------------------------------------------

    def create(
        self, tenant: str | None, action: str, query: SearchQuery, rate_per_s: float | None = None
    ) -> BulkJob:
        """A new running job (its first task is the caller's to send); the query is frozen now."""
        if action not in BULK_ACTIONS:
            raise InvalidRequest(f"a bulk action is one of {', '.join(BULK_ACTIONS)}, not {action[:40]!r}")
        rate = DEFAULT_RATE_PER_S if rate_per_s is None else float(rate_per_s)
        if not MIN_RATE_PER_S <= rate <= MAX_RATE_PER_S:
            raise InvalidRequest(f"rate_per_s must be in {MIN_RATE_PER_S}..{MAX_RATE_PER_S}, got {rate}")
        # Counted in the running jobs themselves, not in the tenant's listing, which keeps its newest
        # jobs only: a tenant making and cancelling jobs would push its running ones out of it.
        running = sum(1 for owner, _ in self.active() if owner == tenant)
        if running >= MAX_RUNNING_PER_TENANT:
            raise InvalidRequest(
                f"{running} bulk jobs are running already (at most {MAX_RUNNING_PER_TENANT}): wait for"
                " one to end or cancel one"
            )
        now = time.time()
        job = BulkJob(
            job_id=uuid.uuid4().hex,
            tenant=tenant,
            action=action,  # checked above
            query=query.frozen_at(now),
            rate_per_s=rate,
            status="running",
            created_at=now,
            updated_at=now,
        )
        spec = job.model_dump_json(include=_SPEC_FIELDS)
        k = self.keys
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                k.bulk_job(tenant, job.job_id),
                mapping={"spec": spec, "status": "running", "updated_at": now, "kicked_at": now},
            )
            pipe.zadd(k.bulk_index(tenant), {job.job_id: int(now * 1000)})
            pipe.sadd(k.bulk_active(), json.dumps([tenant, job.job_id]))
            pipe.execute()
        self._trim(tenant)
        return job

    def load(self, tenant: str | None, job_id: str) -> BulkJob | None:
        """The job, if ``tenant`` has one with this id."""
        raw = self.redis.hgetall(self.keys.bulk_job(tenant, job_id))
        if not raw:
            return None
        fields = {_s(k): _s(v) for k, v in raw.items()}
        spec = json.loads(fields["spec"])
        return BulkJob(
            **spec,
            status=fields.get("status", "running"),
            acted=int(fields.get("n_acted", 0)),
            skipped=int(fields.get("n_skipped", 0)),
            failed=int(fields.get("n_failed", 0)),
            updated_at=float(fields.get("updated_at", spec["created_at"])),
            finished_at=float(fields["finished_at"]) if "finished_at" in fields else None,
        )

    def list_jobs(self, tenant: str | None, limit: int = 50) -> list[BulkJob]:
        """The tenant's jobs, newest first."""
        raw = self.redis.zrevrange(self.keys.bulk_index(tenant), 0, limit - 1)
        ids = [_s(cast(bytes | str, i)) for i in raw]
        jobs = [self.load(tenant, job_id) for job_id in ids]
        return [job for job in jobs if job is not None]

    def outcomes(self, tenant: str | None, job_id: str) -> dict[str, BulkOutcome]:
        """Run id -> what the job did to it (every run it recorded)."""
        raw = self.redis.hgetall(self.keys.bulk_outcomes(tenant, job_id))
        return {_s(k): BulkOutcome.model_validate_json(v) for k, v in raw.items()}

    def cursor(self, tenant: str | None, job_id: str) -> str | None:
        raw = self.redis.hget(self.keys.bulk_job(tenant, job_id), "cursor")
        return _s(raw) if raw else None

    def status(self, tenant: str | None, job_id: str) -> str | None:
        raw = self.redis.hget(self.keys.bulk_job(tenant, job_id), "status")
        return _s(raw) if raw is not None else None

    # -- working on a job --------------------------------------------------------------------------

    def hold(self, tenant: str | None, job_id: str, token: str, lease_s: float) -> bool:
        """Take (or extend) the job's lock for ``lease_s``: True if ``token`` holds it after."""
        key = self.keys.bulk_lock(tenant, job_id)
        return int(self._lock(keys=[key], args=[token, int(lease_s * 1000), "hold"])) == 1

    def release(self, tenant: str | None, job_id: str, token: str) -> None:
        self._lock(keys=[self.keys.bulk_lock(tenant, job_id)], args=[token, 0, "release"])

    def held(self, tenant: str | None, job_id: str) -> bool:
        return bool(self.redis.exists(self.keys.bulk_lock(tenant, job_id)))

    def done_already(self, tenant: str | None, job_id: str, run_id: str) -> bool:
        return bool(self.redis.hexists(self.keys.bulk_outcomes(tenant, job_id), run_id))

    def record(self, tenant: str | None, job_id: str, outcome: BulkOutcome) -> bool:
        """Record what was done to a run, once; False when it was recorded already."""
        k = self.keys
        reply = self._record(
            keys=[k.bulk_job(tenant, job_id), k.bulk_outcomes(tenant, job_id)],
            args=[outcome.run_id, outcome.model_dump_json(), _COUNTERS[outcome.result]],
        )
        return int(reply) == 1

    def advance(self, tenant: str | None, job_id: str, cursor: str) -> None:
        """The next chunk starts after ``cursor`` (every run before it is recorded)."""
        key = self.keys.bulk_job(tenant, job_id)
        self.redis.hset(key, mapping={"cursor": cursor, "updated_at": time.time()})

    def kicked(self, tenant: str | None, job_id: str, countdown: float = 0.0) -> None:
        """Note that a task for the job was just sent, due in ``countdown`` seconds (the sweeper
        waits for it, from when it is due, before sending another)."""
        self.redis.hset(self.keys.bulk_job(tenant, job_id), "kicked_at", time.time() + max(0.0, countdown))

    def kicked_at(self, tenant: str | None, job_id: str) -> float:
        """When the job's last task sent is due (see :meth:`kicked`)."""
        raw = self.redis.hget(self.keys.bulk_job(tenant, job_id), "kicked_at")
        return float(_s(raw)) if raw else 0.0

    def end(self, tenant: str | None, job_id: str, status: BulkStatus) -> bool:
        """End a running job as ``done`` or ``cancelled``; False if it had ended already.

        A cancel racing the last chunk's end may be overwritten by it (or overwrite it): either
        answer is true of the job, which acts on no run after either.
        """
        k = self.keys
        key = k.bulk_job(tenant, job_id)
        if self.status(tenant, job_id) != "running":
            return False
        now = time.time()
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"status": status, "finished_at": now, "updated_at": now})
            pipe.expire(key, JOB_RETENTION_S)
            pipe.expire(k.bulk_outcomes(tenant, job_id), JOB_RETENTION_S)
            pipe.srem(k.bulk_active(), json.dumps([tenant, job_id]))
            pipe.execute()
        return True

    def active(self) -> list[tuple[str | None, str]]:
        """(tenant, job id) of every running job."""
        members = self.redis.smembers(self.keys.bulk_active())
        pairs = [json.loads(_s(m)) for m in members]
        return [(tenant, job_id) for tenant, job_id in pairs]

    def forget(self, tenant: str | None, job_id: str) -> None:
        """Drop a job from the running ones whose record is gone (expired)."""
        self.redis.srem(self.keys.bulk_active(), json.dumps([tenant, job_id]))

    def _trim(self, tenant: str | None) -> None:
        """Keep the tenant's index to its newest :data:`MAX_JOBS_PER_TENANT` jobs (and those whose
        record expired out of it)."""
        key = self.keys.bulk_index(tenant)
        if self.redis.zcard(key) > MAX_JOBS_PER_TENANT:
            self.redis.zremrangebyrank(key, 0, -MAX_JOBS_PER_TENANT - 1)
        cutoff_ms = (time.time() - JOB_RETENTION_S) * 1000
        self.redis.zremrangebyscore(key, "-inf", cutoff_ms)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
