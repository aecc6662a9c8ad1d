"""A tenant's in-flight limit under concurrent submits: exactly the limit is admitted, from one API
process or from two on the same Redis, and the rest are refused 429 ``too_many_in_flight``. Real
uvicorn processes, real workers, real redis-server (or Redis Cluster with ``--store cluster``)."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from shared.keys import Keys
from shared.tenants import TenantLimits, Tenants
from tests.api_support import ApiProcess, bearer, wait_status
from tests.harness import RedisServer, WorkerProcess

TIMEOUT = 60
LIMIT = 10
SUBMITS = 60


@pytest.fixture(scope="module")
def apis(redis_server: RedisServer, workers: list[WorkerProcess]) -> Iterator[list[ApiProcess]]:
    processes = [ApiProcess(redis_server.url).start() for _ in range(2)]
    yield processes
    for process in processes:
        process.stop()


def burst(urls: list[str], key: str) -> list[httpx.Response]:
    """``SUBMITS`` submits of a run that parks (awaiting approval: in flight until decided), all
    sent at once: each thread waits at a barrier, then posts to its API process."""
    start = threading.Barrier(SUBMITS)

    def submit(i: int) -> httpx.Response:
        with httpx.Client(base_url=urls[i % len(urls)], headers=bearer(key), timeout=TIMEOUT) as http:
            start.wait(timeout=TIMEOUT)
            return http.post("/v1/runs", json={"agent": "needs_approval", "input": f"burst {i}"})

    with ThreadPoolExecutor(SUBMITS) as pool:
        return list(pool.map(submit, range(SUBMITS)))


def check_exactly_the_limit(redis_server: RedisServer, urls: list[str]) -> None:
    tenant = f"burst-{uuid.uuid4().hex[:6]}"
    tenants = Tenants(redis_server.client(), Keys())
    tenants.set_limits(tenant, TenantLimits(max_inflight=LIMIT))
    key, _ = tenants.create_key(tenant)
    answers = burst(urls, key)
    assert Counter(r.status_code for r in answers) == {202: LIMIT, 429: SUBMITS - LIMIT}
    refused = [r for r in answers if r.status_code == 429]
    assert {r.json()["error"]["kind"] for r in refused} == {"too_many_in_flight"}
    assert {r.headers["retry-after"] for r in refused} == {"5"}
    assert all(r.json()["error"]["details"] == {"limit": LIMIT, "in_flight": LIMIT} for r in refused)
    with httpx.Client(base_url=urls[0], headers=bearer(key), timeout=TIMEOUT) as http:
        listed = http.get("/v1/runs", params={"limit": 200}).json()["runs"]
        admitted = sorted(r.json()["run_id"] for r in answers if r.status_code == 202)
        assert sorted(r["run_id"] for r in listed) == admitted
        # One more is refused while they are in flight; one ended gives its place back.
        more = http.post("/v1/runs", json={"agent": "needs_approval", "input": "one more"})
        assert more.status_code == 429 and more.json()["error"]["kind"] == "too_many_in_flight"
        for run_id in admitted:
            wait_status(http, run_id, {"awaiting_approval"}, TIMEOUT)
            assert http.post(f"/v1/runs/{run_id}/cancel").status_code == 202
        for run_id in admitted:
            wait_status(http, run_id, {"interrupted"}, TIMEOUT)
        assert http.post("/v1/runs", json={"agent": "direct", "input": "after"}).status_code == 202


def test_concurrent_submits_to_one_process_admit_exactly_the_limit(
    apis: list[ApiProcess], redis_server: RedisServer
) -> None:
    check_exactly_the_limit(redis_server, [apis[0].url])


def test_concurrent_submits_to_two_processes_admit_exactly_the_limit(
    apis: list[ApiProcess], redis_server: RedisServer
) -> None:
    check_exactly_the_limit(redis_server, [api.url for api in apis])


def test_a_replayed_submit_is_answered_at_the_limit(
    apis: list[ApiProcess], redis_server: RedisServer
) -> None:
    tenant = f"replay-{uuid.uuid4().hex[:6]}"
    tenants = Tenants(redis_server.client(), Keys())
    tenants.set_limits(tenant, TenantLimits(max_inflight=1))
    key, _ = tenants.create_key(tenant)
    body = {"agent": "needs_approval", "input": "once"}
    with httpx.Client(base_url=apis[0].url, headers=bearer(key), timeout=TIMEOUT) as http:
        first = http.post("/v1/runs", json=body, headers={"Idempotency-Key": "k1"})
        assert first.status_code == 202
        other = http.post("/v1/runs", json=body, headers={"Idempotency-Key": "k2"})
        assert other.status_code == 429 and other.json()["error"]["kind"] == "too_many_in_flight"
        again = http.post("/v1/runs", json=body, headers={"Idempotency-Key": "k1"})
        assert again.status_code == 202 and again.json()["run_id"] == first.json()["run_id"]
        run_id = first.json()["run_id"]
        wait_status(http, run_id, {"awaiting_approval"}, TIMEOUT)
        assert http.post(f"/v1/runs/{run_id}/cancel").status_code == 202
        wait_status(http, run_id, {"interrupted"}, TIMEOUT)
