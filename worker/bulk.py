"""The pool works bulk jobs (``shared/bulk.py``): a chunk of runs per task, then the next task.

``wesichain.bulk.run`` takes the job's lock, reads the next page of the job's search from its
cursor, acts on each run not recorded yet (at the job's rate), records each outcome once, moves the
cursor past the page, lets the lock go and sends itself again; the search's last page ends the job.
The sweeper's :meth:`BulkPool.tick` sends the task again for a running job nobody holds whose last
task is overdue: a worker killed mid-chunk leaves its lock to expire, and the chunk is redone by
another, passing over the runs it recorded.

A tenant's job retries and forks its runs as the API would (``Client.retry``, ``Client.fork``),
each checked against what the tenant is allowed when the chunk is worked: a run whose model, queue
namespace or Celery callback was taken back since is recorded failed (``ModelNotAllowed``,
``NotAllowed``), not redone with it. Each takes its place under the tenant's limits as a submit
does (``producer/admission.py``): while the tenant has as many runs in flight as it may, or has
started as many as it may this minute, the job waits.

Outcome reasons are the runtime's own words (never a run's input or metadata): they are shown to
the tenant and may be logged.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from producer.admission import Admissions, TenantLimited
from producer.client import Client, NoLiveWorker, RequestConflict, RunHandle, UnknownAgent, idempotent_run_id
from producer.publishing import PUBLISH_ERRORS
from shared.bulk import BulkJob, BulkOutcome, BulkStore, bulk_task
from shared.errors import InvalidRequest, StoreFull, ThreadBusy
from shared.state import RunHead, TaskSpec
from shared.tenants import Tenants, TenantSettings, check_copy_allowed
from shared.timetravel import last_good_checkpoint

__all__ = [
    "BulkPool",
    "CHUNK",
]

log = logging.getLogger("wesichain.bulk")

#: Runs one task reads and acts on before it hands the job to the next task.
CHUNK = 20
#: Seconds a task waits before it tries again, when the pool cannot take new runs now.
_BACK_OFF_S = 5.0
#: The longest a task waits between two runs (a slower rate ends the task and sends the next one
#: with the wait as its countdown).
_MAX_WAIT_IN_TASK_S = 0.25


class _Later(Exception):
    """The pool cannot act now (no live worker, Redis full, broker down, the tenant at its limits):
    the chunk stops here and the job goes on later (nothing is recorded for the run)."""


class BulkPool:
    """What the pool does for bulk jobs; ``client`` creates and cancels the runs."""

    def __init__(self, client: Client, send: Callable[[TaskSpec], None], lease_s: float) -> None:
        self.client = client
        self.store = client.store
        self.jobs = BulkStore(self.store.redis, self.store.keys)
        self.tenants = Tenants(self.store.redis, self.store.keys)
        #: A retry's or fork's place under its tenant's limits, as an API submit takes one.
        self.admissions = Admissions(self.store)
        self.send = send
        #: A delivery holds a job this long past its last renewal (once per run acted on).
        self.lease_s = lease_s
        self.sleep: Callable[[float], None] = time.sleep

    # -- one task -------------------------------------------------------------------------------

    def run(self, tenant: str | None, job_id: str) -> int:
        """Work the next chunk of the job; returns how many runs it recorded."""
        job = self.jobs.load(tenant, job_id)
        if job is None or job.status != "running":
            return 0
        token = uuid.uuid4().hex
        if not self.jobs.hold(tenant, job_id, token, self.lease_s):
            return 0  # another delivery works on it (it sends the next task)
        again: float | None = 0.0
        recorded = 0
        try:
            recorded, again = self._chunk(job, token)
        finally:
            self.jobs.release(tenant, job_id, token)
        if again is not None:
            self._kick(tenant, job_id, again)
        return recorded

    def _chunk(self, job: BulkJob, token: str) -> tuple[int, float | None]:
        """Act on the next page; (runs recorded, when to send the next task: None, never)."""
        tenant, job_id = job.tenant, job.job_id
        cursor = self.jobs.cursor(tenant, job_id)
        page = self.store.search_runs(tenant, job.query, cursor=cursor, limit=CHUNK)
        recorded = 0
        interval = 1.0 / job.rate_per_s
        # Read once a chunk (a change applies from the next one), as the API reads it per request.
        allowed = self.tenants.settings(tenant) if tenant is not None and job.action != "cancel" else None
        for head in page.runs:
            if self.jobs.status(tenant, job_id) != "running":
                return recorded, None  # cancelled
            if not self.jobs.hold(tenant, job_id, token, self.lease_s):
                return recorded, None  # lost the lock (a stall past the lease): its holder goes on
            if self.jobs.done_already(tenant, job_id, head.run_id):
                continue
            started = time.monotonic()
            try:
                outcome = self._act(job, head, allowed)
            except _Later as exc:
                log.warning("bulk job %s waits: %s", job_id, exc)
                return recorded, _BACK_OFF_S
            recorded += int(self.jobs.record(tenant, job_id, outcome))
            # The rate: one run per interval, the action's own time included. A longer wait is not
            # spent holding a worker's slot: the next task is sent with it as its countdown, and
            # goes on with the page's next run (the cursor moves once the whole page is done).
            wait = interval - (time.monotonic() - started)
            if wait > _MAX_WAIT_IN_TASK_S:
                return recorded, wait
            self.sleep(max(0.0, wait))
        if page.next_cursor is None:
            self.jobs.end(tenant, job_id, "done")
            return recorded, None
        self.jobs.advance(tenant, job_id, page.next_cursor)
        return recorded, 0.0

    def _kick(self, tenant: str | None, job_id: str, countdown: float) -> None:
        self.jobs.kicked(tenant, job_id, countdown)
        try:
            self.send(bulk_task(tenant, job_id, countdown=countdown))
        except PUBLISH_ERRORS as exc:  # the sweeper sends it once the broker takes messages again
            log.warning("bulk job %s: its next task was not sent (%s)", job_id, type(exc).__name__)

    # -- the actions ----------------------------------------------------------------------------

    def _act(self, job: BulkJob, head: RunHead, allowed: TenantSettings | None) -> BulkOutcome:
        """Act on one run; ``allowed``: what its tenant may name now (None: anything)."""
        run_id = head.run_id
        if head.parent is not None or head.link is not None:
            return _skipped(run_id, "started by the runtime (a subagent, pipeline or eval run)")
        if job.action == "cancel":
            if head.terminal:
                return _skipped(run_id, f"already ended ({head.status})")
            RunHandle(self.client, run_id).cancel()
            return BulkOutcome(run_id=run_id, result="acted")
        if not head.terminal:
            return _skipped(run_id, f"not ended ({head.status})")
        # Derived from (job, run): redoing this run after a crash finds the run made the first time,
        # before it takes a reservation that would count that run's submit a second time.
        key = f"bulk:{job.job_id}:{run_id}"
        made = idempotent_run_id(head.tenant, key)
        if self.store.load(made) is not None:
            return BulkOutcome(run_id=run_id, result="acted", new_run_id=made)
        new_id: str | None
        models = allowed.models if allowed is not None else None
        reservation = None
        try:
            if allowed is not None and head.tenant is not None:
                check_copy_allowed(
                    head, allowed.namespaces, allowed.callbacks, callback=job.action == "retry"
                )
                # The tenant's runs in flight and submits per minute bound its bulk jobs too: at
                # its limits, the job waits (``_Later``) as a submit would be told to.
                reservation = self.admissions.reserve(head.tenant, allowed.limits)
            if job.action == "retry":
                new_id = self._retry(head, key, models)
            else:
                new_id = self._fork(head, made, models)
        except TenantLimited as exc:
            raise _Later(exc.kind) from None
        except (NoLiveWorker, StoreFull) as exc:
            raise _Later(type(exc).__name__) from None
        except PUBLISH_ERRORS as exc:
            raise _Later(type(exc).__name__) from None
        except (UnknownAgent, RequestConflict, InvalidRequest, ThreadBusy) as exc:
            return BulkOutcome(run_id=run_id, result="failed", reason=_reason(exc))
        finally:
            self.admissions.release(reservation)
        if new_id is None:
            return _skipped(run_id, "no checkpoint before its end")
        return BulkOutcome(run_id=run_id, result="acted", new_run_id=new_id)

    def _retry(self, head: RunHead, key: str, models: tuple[str, ...] | None) -> str:
        """A fresh run with the same request (``Client.retry``)."""
        return self.client.retry(head, idempotency_key=key, allowed_models=models).run_id

    def _fork(self, head: RunHead, new_id: str, models: tuple[str, ...] | None) -> str | None:
        """A fork, as ``new_id``, from the last checkpoint before the run ended (``last_good_checkpoint``)."""
        good = last_good_checkpoint(self.store.checkpoints(head.run_id))
        if good is None:
            return None
        return self.client.fork(head.run_id, good.version, new_run_id=new_id, allowed_models=models).run_id

    # -- the sweeper's repair -------------------------------------------------------------------

    def tick(self) -> int:
        """Send the task again for each running job nobody holds whose last task is overdue (its
        worker died, or the message was lost); returns how many."""
        sent = 0
        now = time.time()
        for tenant, job_id in self.jobs.active():
            status = self.jobs.status(tenant, job_id)
            if status is None:
                self.jobs.forget(tenant, job_id)
                continue
            if status != "running" or self.jobs.held(tenant, job_id):
                continue
            if now - self.jobs.kicked_at(tenant, job_id) < self.lease_s:
                continue  # its task may still be waiting in the queue
            log.info("bulk job %s: nobody works on it, sending its task again", job_id)
            self._kick(tenant, job_id, 0.0)
            sent += 1
        return sent


def _skipped(run_id: str, reason: str) -> BulkOutcome:
    return BulkOutcome(run_id=run_id, result="skipped", reason=reason)


def _reason(exc: Exception) -> str:
    """Why an action was refused, in the runtime's words (its errors name no conversation text)."""
    message = getattr(exc, "message", None) or str(exc)
    return f"{type(exc).__name__}: {message}"[:300]
