"""An API process SIGKILLed in the middle of a burst of submits at a tenant's in-flight limit.

The submit path reserves a place and reads the in-flight counts in one script, and the create
script drops the reservation in the step that counts the run (on Redis Cluster, a round trip
after it). A process killed anywhere in between leaves, at worst, a reservation of its own
(expiring after ``RESERVE_TTL_MS``) and perhaps a created run whose reservation is still counted:
both only make later submits wait. So, across the kill and a restart, no more runs than the limit are ever in
flight, every run a client was answered 202 for exists, and once the dead process's reservations
have expired the tenant gets exactly its limit again.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx

from producer.admission import RESERVE_TTL_MS, reservations_key
from shared.keys import Keys
from shared.settings import Settings
from shared.store import RunStore
from shared.tenants import TenantLimits, Tenants
from tests.api_support import ApiProcess, bearer
from tests.chaos.support import Cluster
from tests.harness import RedisServer, wait_until

LIMIT = 6
SUBMITS = 40
TIMEOUT = 60


def _burst(url: str, key: str, first_accepted: threading.Event | None = None) -> list[tuple[int, str | None]]:
    """``SUBMITS`` submits of a run that parks (in flight until decided), sent at once; each answer
    as (status, run id), status 0 for a request the server never answered (it was killed)."""
    start = threading.Barrier(SUBMITS)

    def submit(i: int) -> tuple[int, str | None]:
        with httpx.Client(base_url=url, headers=bearer(key), timeout=TIMEOUT) as http:
            start.wait(timeout=TIMEOUT)
            try:
                answer = http.post("/v1/runs", json={"agent": "needs_approval", "input": f"burst {i}"})
            except httpx.TransportError:
                return 0, None
        if answer.status_code == 202 and first_accepted is not None:
            first_accepted.set()
        return answer.status_code, answer.json()["run_id"] if answer.status_code == 202 else None

    with ThreadPoolExecutor(SUBMITS) as pool:
        return list(pool.map(submit, range(SUBMITS)))


def test_an_api_killed_mid_burst_never_admits_past_the_in_flight_limit(
    cluster: Cluster, server: RedisServer
) -> None:
    cluster.start(1)
    tenant = f"kill-{uuid.uuid4().hex[:6]}"
    redis = server.client()
    tenants = Tenants(redis, Keys())
    tenants.set_limits(tenant, TenantLimits(max_inflight=LIMIT))
    key, _ = tenants.create_key(tenant)
    store = RunStore(redis, Settings(redis_url=server.url))
    api = ApiProcess(server.url).start()
    try:
        accepted = threading.Event()
        with ThreadPoolExecutor(1) as background:
            first = background.submit(_burst, api.url, key, accepted)
            assert accepted.wait(TIMEOUT), "no submit of the first burst was accepted"
            api.kill()  # SIGKILL, while the rest of the burst is being served
            answers = first.result(TIMEOUT)
        api.start()
        answers += _burst(api.url, key)
        statuses = Counter(status for status, _ in answers)
        assert set(statuses) <= {0, 202, 429, 503}, statuses
        answered = {run_id for _, run_id in answers if run_id is not None}
        # Never past the limit, and every run a client was told about exists.
        assert 1 <= len(answered) <= LIMIT
        assert store.inflight(tenant) <= LIMIT
        with httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as http:
            listed = {r["run_id"] for r in http.get("/v1/runs", params={"limit": 200}).json()["runs"]}
            assert answered <= listed and len(listed) <= LIMIT

            # The dead process's reservations expire; then exactly the limit is in flight again.
            wait_until(
                lambda: redis.zcard(reservations_key(Keys().submits(tenant))) == 0,
                timeout=RESERVE_TTL_MS / 1000 + 30,
                interval=0.2,
                what="the killed process's reservations to expire",
            )
            while (
                more := http.post("/v1/runs", json={"agent": "needs_approval", "input": "more"})
            ).status_code == 202:
                assert store.inflight(tenant) <= LIMIT
            assert more.status_code == 429 and more.json()["error"]["kind"] == "too_many_in_flight"
            listed = {r["run_id"] for r in http.get("/v1/runs", params={"limit": 200}).json()["runs"]}
        assert len(listed) == LIMIT and store.inflight(tenant) == LIMIT
    finally:
        api.stop()
