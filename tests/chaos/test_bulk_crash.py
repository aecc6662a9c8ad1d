"""A bulk retry survives the SIGKILL of the worker running it: every source is retried once.

Thirty failed runs of one tenant are retried by a bulk job at 5 runs a second on a single worker,
whose whole process group is SIGKILLed while it holds the job in the middle of a chunk. A second
worker's sweeper finds the job held by nobody once the dead worker's lease runs out and sends its
task again; the chunk is redone from the job's cursor, passing over the runs it recorded, and the
run the dead worker may have created without recording it is found again through its
idempotency key. The job ends with exactly 30 retries: one new run per source, no more.
"""

from __future__ import annotations

from pathlib import Path

from producer.client import Client, idempotent_run_id
from shared.bulk import BulkStore
from shared.search import SearchQuery
from tests.broker import Settings
from tests.chaos.support import CHAOS_ENV
from tests.harness import RedisServer, WorkerProcess, wait_until

SOURCES = 30
TENANT = "bulk-chaos"
TIMEOUT = 90


def test_a_bulk_retry_resumes_after_its_worker_is_killed_and_retries_each_run_once(
    server: RedisServer, tmp_path: Path
) -> None:
    env = {"WESICHAIN_LEASE_S": CHAOS_ENV["WESICHAIN_LEASE_S"], "WESICHAIN_QUEUED_LEASE_S": "2"}
    first = WorkerProcess("bulk1", server.url, concurrency=4, env=env, log_dir=str(tmp_path)).start()
    second = WorkerProcess("bulk2", server.url, concurrency=4, env=env, log_dir=str(tmp_path))
    client = Client(Settings(redis_url=server.url, agents_module="tests.agents_fixture"))
    try:
        sources = [client.submit("model_fail", f"case {i}", tenant=TENANT) for i in range(SOURCES)]
        for handle in sources:
            handle.wait(TIMEOUT)
        source_ids = {h.run_id for h in sources}

        job = client.bulk("retry", SearchQuery(status="failed"), tenant=TENANT, rate_per_s=5)
        jobs = BulkStore(client.store.redis, client.store.keys)

        def mid_chunk() -> bool:
            now = client.bulk_job(job.job_id, tenant=TENANT)
            return 5 <= now.acted < SOURCES - 5 and jobs.held(TENANT, job.job_id)

        wait_until(mid_chunk, TIMEOUT, interval=0.02, what="the bulk job to be under way")
        first.kill()
        killed_at = client.bulk_job(job.job_id, tenant=TENANT).acted
        first.stop()
        assert 5 <= killed_at < SOURCES

        second.start()

        def ended() -> bool:
            return client.bulk_job(job.job_id, tenant=TENANT).status != "running"

        wait_until(ended, TIMEOUT, interval=0.1, what="the bulk job to resume and end on the second worker")
        done = client.bulk_job(job.job_id, tenant=TENANT)
        assert (done.status, done.acted, done.skipped, done.failed) == ("done", SOURCES, 0, 0)

        outcomes = client.bulk_outcomes(job.job_id, tenant=TENANT)
        assert set(outcomes) == source_ids
        new_ids = {o.new_run_id for o in outcomes.values() if o.new_run_id is not None}
        assert new_ids == {idempotent_run_id(TENANT, f"bulk:{job.job_id}:{s}") for s in source_ids}
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
        assert set(everything) == source_ids | new_ids
        for run_id in new_ids:
            retry = client.store.load(run_id)
            assert retry is not None and retry.agent == "model_fail" and retry.tenant == TENANT
    finally:
        client.close()
        first.kill()
        first.stop()
        second.kill()
        second.stop()


def test_a_slow_bulk_job_whose_waiting_task_dies_with_its_worker_goes_on(
    server: RedisServer, tmp_path: Path
) -> None:
    """A job at one run every 5 s waits between runs in a task sent with a countdown, which the
    worker holds (Celery keeps a countdown task in the worker until it is due). Killed with that
    worker, the task is gone until the broker's visibility timeout (an hour); the other worker's
    sweeper sends it again once it is overdue, and the job ends with each run retried once."""
    sources_n = 3
    env = {"WESICHAIN_LEASE_S": CHAOS_ENV["WESICHAIN_LEASE_S"], "WESICHAIN_QUEUED_LEASE_S": "2"}
    first = WorkerProcess("slow1", server.url, concurrency=2, env=env, log_dir=str(tmp_path)).start()
    second = WorkerProcess("slow2", server.url, concurrency=2, env=env, log_dir=str(tmp_path))
    client = Client(Settings(redis_url=server.url, agents_module="tests.agents_fixture"))
    try:
        sources = [client.submit("model_fail", f"slow case {i}", tenant=TENANT) for i in range(sources_n)]
        for handle in sources:
            handle.wait(TIMEOUT)
        source_ids = {h.run_id for h in sources}
        job = client.bulk("retry", SearchQuery(status="failed"), tenant=TENANT, rate_per_s=0.2)
        jobs = BulkStore(client.store.redis, client.store.keys)

        def waiting_between_runs() -> bool:
            now = client.bulk_job(job.job_id, tenant=TENANT)
            return now.acted == 1 and not jobs.held(TENANT, job.job_id)

        wait_until(waiting_between_runs, TIMEOUT, interval=0.02, what="the job to wait for its next run")

        def holding_the_countdown_task() -> bool:
            # The job's first task, then the one sent with the countdown: received, so in this
            # worker's hands (and the broker's unacked hash), not in the queue.
            return first.log().count(f"wesichain.bulk.run[bulk:{job.job_id}:") >= 3

        wait_until(holding_the_countdown_task, TIMEOUT, interval=0.02, what="the worker to hold its task")
        first.kill()
        first.stop()
        second.start()

        def ended() -> bool:
            return client.bulk_job(job.job_id, tenant=TENANT).status != "running"

        wait_until(ended, TIMEOUT, interval=0.1, what="the sweeper to send the lost task and the job to end")
        done = client.bulk_job(job.job_id, tenant=TENANT)
        assert (done.status, done.acted, done.skipped, done.failed) == ("done", sources_n, 0, 0)
        outcomes = client.bulk_outcomes(job.job_id, tenant=TENANT)
        assert set(outcomes) == source_ids
        assert {o.new_run_id for o in outcomes.values()} == {
            idempotent_run_id(TENANT, f"bulk:{job.job_id}:{s}") for s in source_ids
        }
        assert "nobody works on it, sending its task again" in second.log()
    finally:
        client.close()
        first.kill()
        first.stop()
        second.kill()
        second.stop()
