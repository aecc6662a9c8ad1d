"""A bulk retry survives the SIGKILL of the worker running it: every source is retried once.

Thirty failed runs of one tenant are retried by a bulk job at 5 runs a second on a single worker,
whose whole process group is SIGKILLed while it holds the job in the middle of a chunk. A second
worker's sweeper finds the job held by nobody once the dead worker's lease runs out and sends its
task again; the chunk is redone from the job's cursor, passing over the runs it recorded, and the
run the dead worker may have created without recording it is found again through its
idempotency key. The job ends with exactly 30 retries: one new run per source, no more.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from producer.client import Client, idempotent_run_id
from shared.bulk import BulkJob, BulkStore
from shared.search import SearchQuery
from tests.broker import Settings
from tests.chaos.support import CHAOS_ENV
from tests.harness import RedisServer, WorkerProcess, wait_until

SOURCES = 30
TENANT = "bulk-chaos"
TIMEOUT = 90


@dataclass
class Setup:
    """A worker running, a second one to start once the first is killed, and failed runs to retry."""

    first: WorkerProcess
    second: WorkerProcess
    client: Client
    sources: set[str]

    def ended_job(self, job_id: str, what: str) -> BulkJob:
        def ended() -> bool:
            return self.client.bulk_job(job_id, tenant=TENANT).status != "running"

        wait_until(ended, TIMEOUT, interval=0.1, what=what)
        return self.client.bulk_job(job_id, tenant=TENANT)

    def check_one_retry_each(self, job_id: str) -> set[str]:
        """Each source was retried once, as the run its job and id name; returns the retries."""
        outcomes = self.client.bulk_outcomes(job_id, tenant=TENANT)
        assert set(outcomes) == self.sources
        new_ids = {o.new_run_id for o in outcomes.values() if o.new_run_id is not None}
        assert new_ids == {idempotent_run_id(TENANT, f"bulk:{job_id}:{s}") for s in self.sources}
        return new_ids


@contextmanager
def setup(server: RedisServer, tmp_path: Path, name: str, sources: int, concurrency: int) -> Iterator[Setup]:
    env = {"WESICHAIN_LEASE_S": CHAOS_ENV["WESICHAIN_LEASE_S"], "WESICHAIN_QUEUED_LEASE_S": "2"}
    first = WorkerProcess(f"{name}1", server.url, concurrency=concurrency, env=env, log_dir=str(tmp_path))
    second = WorkerProcess(f"{name}2", server.url, concurrency=concurrency, env=env, log_dir=str(tmp_path))
    client = Client(Settings(redis_url=server.url, agents_module="tests.agents_fixture"))
    try:
        first.start()
        handles = [client.submit("model_fail", f"{name} case {i}", tenant=TENANT) for i in range(sources)]
        for handle in handles:
            handle.wait(TIMEOUT)
        yield Setup(first, second, client, {h.run_id for h in handles})
    finally:
        client.close()
        for worker in (first, second):
            worker.kill()
            worker.stop()


def test_a_bulk_retry_resumes_after_its_worker_is_killed_and_retries_each_run_once(
    server: RedisServer, tmp_path: Path
) -> None:
    with setup(server, tmp_path, "bulk", SOURCES, concurrency=4) as it:
        client = it.client
        job = client.bulk("retry", SearchQuery(status="failed"), tenant=TENANT, rate_per_s=5)
        jobs = BulkStore(client.store.redis, client.store.keys)

        def mid_chunk() -> bool:
            now = client.bulk_job(job.job_id, tenant=TENANT)
            return 5 <= now.acted < SOURCES - 5 and jobs.held(TENANT, job.job_id)

        wait_until(mid_chunk, TIMEOUT, interval=0.02, what="the bulk job to be under way")
        it.first.kill()
        killed_at = client.bulk_job(job.job_id, tenant=TENANT).acted
        it.first.stop()
        assert 5 <= killed_at < SOURCES

        it.second.start()
        done = it.ended_job(job.job_id, "the bulk job to resume and end on the second worker")
        assert (done.status, done.acted, done.skipped, done.failed) == ("done", SOURCES, 0, 0)
        new_ids = it.check_one_retry_each(job.job_id)
        # Exactly 30 runs more in the tenant: the sources and one retry each.
        everything: list[str] = []
        cursor = None
        while True:
            page = client.search(tenant=TENANT, cursor=cursor, limit=100)
            everything += [h.run_id for h in page.runs]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert len(everything) == len(set(everything)) == 2 * SOURCES
        assert set(everything) == it.sources | new_ids
        for run_id in new_ids:
            retry = client.store.load(run_id)
            assert retry is not None and retry.agent == "model_fail" and retry.tenant == TENANT


def test_a_slow_bulk_job_whose_waiting_task_dies_with_its_worker_goes_on(
    server: RedisServer, tmp_path: Path
) -> None:
    """A job at one run every 5 s waits between runs in a task sent with a countdown, which the
    worker holds (Celery keeps a countdown task in the worker until it is due). Killed with that
    worker, the task is gone until the broker's visibility timeout (an hour); the other worker's
    sweeper sends it again once it is overdue, and the job ends with each run retried once."""
    with setup(server, tmp_path, "slow", 3, concurrency=2) as it:
        client = it.client
        job = client.bulk("retry", SearchQuery(status="failed"), tenant=TENANT, rate_per_s=0.2)
        jobs = BulkStore(client.store.redis, client.store.keys)

        def waiting_between_runs() -> bool:
            now = client.bulk_job(job.job_id, tenant=TENANT)
            return now.acted == 1 and not jobs.held(TENANT, job.job_id)

        wait_until(waiting_between_runs, TIMEOUT, interval=0.02, what="the job to wait for its next run")

        def holding_the_countdown_task() -> bool:
            # The job's first task, then the one sent with the countdown: received, so in this
            # worker's hands (and the broker's unacked hash), not in the queue.
            return it.first.log().count(f"wesichain.bulk.run[bulk:{job.job_id}:") >= 3

        wait_until(holding_the_countdown_task, TIMEOUT, interval=0.02, what="the worker to hold its task")
        it.first.kill()
        it.first.stop()
        it.second.start()
        done = it.ended_job(job.job_id, "the sweeper to send the lost task and the job to end")
        assert (done.status, done.acted, done.skipped, done.failed) == ("done", 3, 0, 0)
        assert len(it.check_one_retry_each(job.job_id)) == 3
        assert "nobody works on it, sending its task again" in it.second.log()
