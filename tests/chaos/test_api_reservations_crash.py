"""An API process SIGKILLed while its submits hold in-flight reservations.

A tenant at ``max_inflight`` N sends N submits to an API process that stops each one right after
its reservation is taken (``tests/chaos/paused_api.py``), before its run is created, and the process
is SIGKILLed there. (They carry idempotency keys, which a worker thread serves with a reservation;
a submit served on the event loop takes none, admitted in the step that creates its run.) The
reservations outlive their holder in Redis until ``RESERVE_TTL_MS`` runs out by Redis's clock:
until then another API process admits nothing of that tenant (the dead reservations fill its
limit), afterwards it admits exactly N runs and refuses the next with ``too_many_in_flight``. Real
workers, two real ``wesichain api`` processes, real redis-server.
"""

from __future__ import annotations

import sys
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor

import httpx

from producer.admission import RESERVE_TTL_MS, reservations_key
from shared.keys import Keys
from shared.tenants import TenantLimits, Tenants
from tests.api_support import ApiProcess, bearer
from tests.chaos.paused_api import PAUSED_KEY
from tests.chaos.support import Cluster, note_recovery
from tests.harness import RedisServer, wait_until

LIMIT = 3
TIMEOUT = 60


class PausedApi(ApiProcess):
    """The real CLI's ``api`` command, its submits stopped inside their reservation window."""

    def _args(self) -> list[str]:
        args = super()._args()
        assert args[1:3] == ["-m", "producer.cli"]
        return [sys.executable, "-m", "tests.chaos.paused_api", *args[3:]]


def _submit(api_url: str, key: str) -> httpx.Response | None:
    """A submit with a reservation; None when its connection died with the API process."""
    try:
        return httpx.post(
            api_url + "/v1/runs",
            json={"agent": "needs_approval", "input": "x"},
            headers={**bearer(key), "idempotency-key": uuid.uuid4().hex},
            timeout=TIMEOUT,
        )
    except httpx.HTTPError:
        return None


def test_reservations_of_a_killed_api_expire_and_the_limit_holds_throughout(
    cluster: Cluster, server: RedisServer
) -> None:
    cluster.start(1)
    redis = server.client()
    tenants = Tenants(redis, Keys())
    key, record = tenants.create_key(f"crash-{uuid.uuid4().hex[:6]}")
    tenants.set_limits(record.tenant, TenantLimits(max_inflight=LIMIT))
    reserved = reservations_key(Keys().submits(record.tenant))

    doomed = PausedApi(server.url).start()
    with ThreadPoolExecutor(LIMIT) as pool:
        try:
            pending: list[Future[httpx.Response | None]] = [
                pool.submit(_submit, doomed.url, key) for _ in range(LIMIT)
            ]
            wait_until(
                lambda: redis.llen(PAUSED_KEY) == LIMIT, TIMEOUT, what="every submit paused with its place"
            )
            assert redis.zcard(reserved) == LIMIT
            doomed.kill()
            killed = time.monotonic()
        finally:
            doomed.stop()
        # The killed process answered none of them, and created no run.
        assert [f.result() for f in pending] == [None] * LIMIT

    survivor = ApiProcess(server.url).start()
    try:
        with httpx.Client(base_url=survivor.url, headers=bearer(key), timeout=TIMEOUT) as http:
            # The dead reservations still fill the tenant's limit: nothing is admitted over it.
            refused = http.post("/v1/runs", json={"agent": "needs_approval", "input": "x"})
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["kind"] == "unavailable"
            assert http.get("/v1/runs").json()["runs"] == []

            admitted: list[str] = []

            def one_admitted() -> bool:
                answer = http.post("/v1/runs", json={"agent": "needs_approval", "input": "x"})
                if answer.status_code == 202:
                    admitted.append(answer.json()["run_id"])
                    return True
                assert answer.status_code == 503, answer.text  # still the dead reservations
                return False

            # Each dead place comes back when its own reservation expires (they were taken
            # milliseconds apart), each submit admitted only while the limit has room.
            for place in range(LIMIT):
                wait_until(
                    one_admitted, RESERVE_TTL_MS / 1000 + TIMEOUT, what=f"dead reservation {place} to expire"
                )
                if place == 0:
                    note_recovery(
                        "in-flight place of a SIGKILLed API process back", time.monotonic() - killed
                    )
            # Exactly the limit, no more: the places came back once each, none was lost.
            over = http.post("/v1/runs", json={"agent": "needs_approval", "input": "x"})
            assert over.status_code == 429, over.text
            assert over.json()["error"]["details"] == {"limit": LIMIT, "in_flight": LIMIT}
            assert redis.zcard(reserved) == 0
            runs = http.get("/v1/runs").json()["runs"]
            assert sorted(r["run_id"] for r in runs) == sorted(admitted)
            for run_id in admitted:
                assert http.post(f"/v1/runs/{run_id}/cancel").status_code == 202
    finally:
        survivor.stop()
