"""Each tenant's share of one API process's event streams: a tenant holding its share of streams
open without reading them is refused one more (429, its own limit), while another tenant still
opens a stream and follows its run to the end. Real uvicorn process, real workers, real Redis."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from shared.keys import Keys
from shared.tenants import Tenants
from tests.api_support import END, SSE, ApiProcess, bearer, frames, wait_status
from tests.harness import RedisServer, WorkerProcess, wait_until

TIMEOUT = 60
SHARE = 2


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, workers: list[WorkerProcess]) -> Iterator[ApiProcess]:
    # Short keep-alives: the server notices a client that went away when it next writes to it.
    process = ApiProcess(
        redis_server.url,
        env={
            "WESICHAIN_API_KEEPALIVE_S": "0.3",
            "WESICHAIN_API_MAX_STREAMS": "8",
            "WESICHAIN_API_MAX_STREAMS_PER_TENANT": str(SHARE),
        },
    ).start()
    yield process
    process.stop()


def tenant_http(api: ApiProcess, redis_server: RedisServer, name: str) -> httpx.Client:
    key, _ = Tenants(redis_server.client(), Keys()).create_key(f"{name}-{uuid.uuid4().hex[:6]}")
    return httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT)


def parked_run(http: httpx.Client) -> str:
    run_id: str = http.post("/v1/runs", json={"agent": "needs_approval", "input": "x"}).json()["run_id"]
    wait_status(http, run_id, {"awaiting_approval"}, TIMEOUT)
    return run_id


def test_a_tenant_at_its_share_of_streams_leaves_the_others_theirs(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    with tenant_http(api, redis_server, "hog") as hog, tenant_http(api, redis_server, "fair") as fair:
        hog_run = parked_run(hog)
        path = f"/v1/runs/{hog_run}/events"
        with ExitStack() as held:
            # The hog's share of streams, open and never read.
            for _ in range(SHARE):
                assert held.enter_context(hog.stream("GET", path, headers=SSE)).status_code == 200
            refused = hog.get(path, headers=SSE)
            assert refused.status_code == 429, refused.text
            error = refused.json()["error"]
            assert error["kind"] == "too_many_streams"
            assert error["details"] == {"limit": SHARE, "open": SHARE}
            assert refused.headers["retry-after"] == "5"
            # Another tenant still gets a stream, and follows its run to the end through it.
            fair_run = parked_run(fair)
            with fair.stream("GET", f"/v1/runs/{fair_run}/events", headers=SSE) as stream:
                assert stream.status_code == 200
                events = (f.event for f in frames(stream) if f.data)
                assert next(events)["kind"] == "RunStarted"
                assert fair.post(f"/v1/runs/{fair_run}/approve").status_code == 202
                kinds = [e["kind"] for e in events]
            assert kinds[-1] == "Completed" and not set(kinds[:-1]) & END
        # The hog closed its streams: once the server noticed, its share is free again.

        def served() -> bool:
            with hog.stream("GET", path, headers=SSE) as again:
                return again.status_code == 200

        wait_until(served, timeout=TIMEOUT, what="the hog's stream slots to be given back")
        with hog.stream("GET", path, headers=SSE) as one, hog.stream("GET", path, headers=SSE) as two:
            assert one.status_code == two.status_code == 200
        assert hog.post(f"/v1/runs/{hog_run}/cancel").status_code == 202


def test_a_waiting_signal_poll_takes_a_stream_place(api: ApiProcess, redis_server: RedisServer) -> None:
    with tenant_http(api, redis_server, "poller") as http:
        run_id = parked_run(http)
        sent = http.post(f"/v1/runs/{run_id}/messages", json={"text": "are you there?"})
        assert sent.status_code == 202, sent.text
        poll = f"/v1/runs/{run_id}/signals/{sent.json()['id']}"
        with ExitStack() as held:
            for _ in range(SHARE):
                stream = held.enter_context(http.stream("GET", f"/v1/runs/{run_id}/events", headers=SSE))
                assert stream.status_code == 200
            # Held polls would be as many connections polling Redis: a wait needs a place.
            refused = http.get(poll, params={"wait": 5})
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["kind"] == "too_many_streams"
            # Asking without waiting holds nothing.
            assert http.get(poll).json()["status"] == "pending"

        def waited() -> bool:
            response = http.get(poll, params={"wait": 0.2})
            return response.status_code == 200 and response.json()["status"] == "pending"

        wait_until(waited, timeout=TIMEOUT, what="the stream places to be given back")
        assert http.post(f"/v1/runs/{run_id}/cancel").status_code == 202


def test_a_signal_wait_whose_client_went_away_gives_its_place_back(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    """A wait holds one of the tenant's stream places; a client that hangs up must not keep it for
    the rest of the wait (30 s at most), or a tenant's dropped polls lock it out of streams."""
    with tenant_http(api, redis_server, "dropper") as http:
        run_id = parked_run(http)
        sent = http.post(f"/v1/runs/{run_id}/messages", json={"text": "still there?"})
        poll = f"/v1/runs/{run_id}/signals/{sent.json()['id']}"
        waits = [
            httpx.Client(base_url=api.url, headers=dict(http.headers), timeout=0.5) for _ in range(SHARE)
        ]
        for client in waits:
            # The client gives up after 0.5 s of a 30 s wait, and closes its connection.
            with pytest.raises(httpx.ReadTimeout):
                client.get(poll, params={"wait": 30})
            client.close()

        def streams_again() -> bool:
            with http.stream("GET", f"/v1/runs/{run_id}/events", headers=SSE) as stream:
                return stream.status_code == 200

        # Before the 30 s the waits asked for had run out (at once: within 20 s, however loaded).
        wait_until(streams_again, timeout=20, interval=0.2, what="the dropped waits' places to be given back")
        assert http.post(f"/v1/runs/{run_id}/cancel").status_code == 202
