"""Redis restarted (AOF, fsync always) under live SSE streams of the HTTP API.

A service follows its runs over the API while the Redis behind the API goes away and comes back:
the API's reader reconnects, the streams stay open (or the client resumes them with
``Last-Event-ID``), and each follower receives every event of its run exactly once, in order,
ending with the run's end. A run submitted once Redis is back runs as usual.
"""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Iterator

import httpx
import pytest

from producer.api_client import ApiClient
from producer.client import Client
from shared.events import Event
from shared.keys import Keys
from shared.state import Phase
from shared.tenants import Tenants
from tests.api_support import ApiProcess
from tests.chaos.support import RUN_TIMEOUT_S, Cluster, idem, outage, wait_tool_started
from tests.harness import RedisServer, wait_until

pytestmark = pytest.mark.standalone_redis  # stops and restarts the one Redis

FOLLOWERS = 3


@pytest.fixture
def api(aof_server: RedisServer) -> Iterator[ApiProcess]:
    process = ApiProcess(aof_server.url, env={"WESICHAIN_API_KEEPALIVE_S": "1"}).start()
    yield process
    process.stop()


def test_streams_survive_a_redis_restart(
    aof_cluster: Cluster, aof_client: Client, aof_server: RedisServer, api: ApiProcess
) -> None:
    workers = aof_cluster.start(2)
    key, _ = Tenants(aof_server.client(), Keys()).create_key(f"t-{uuid.uuid4().hex[:8]}")
    received: dict[str, list[Event]] = {}
    errors: list[BaseException] = []

    with ApiClient(api.url, key) as client:
        handles = [client.submit("slow_step", "go") for _ in range(FOLLOWERS)]
        for h in handles:
            wait_tool_started(aof_client.store.redis, idem(h.run_id))

        def follow(run_id: str) -> None:
            received[run_id] = []
            try:
                with ApiClient(api.url, key) as own:
                    for event in own.handle(run_id).events():
                        received[run_id].append(event)
            except BaseException as exc:  # reported by the test, not lost in the thread
                errors.append(exc)

        threads = [threading.Thread(target=follow, args=(h.run_id,), daemon=True) for h in handles]
        for t in threads:
            t.start()
        # Every follower is streaming: it has received the events up to its tool's dispatch.
        wait_until(
            lambda: all(any(e.kind == "ToolDispatched" for e in received.get(h.run_id, [])) for h in handles),
            30,
            what="every follower to be streaming",
        )

        outage(aof_server, workers)
        # The API answers while Redis is back and the runs carry on; a submit made now gets a run.
        late = client.submit("one_hop", "after the restart")
        for t in threads:
            t.join(RUN_TIMEOUT_S)
        assert not any(t.is_alive() for t in threads), "a follower never saw its run end"
        assert not errors, errors
        assert late.wait(RUN_TIMEOUT_S).phase is Phase.COMPLETED

    for h in handles:
        head = aof_client.handle(h.run_id).wait(RUN_TIMEOUT_S)
        assert head.phase is Phase.COMPLETED, head.error
        stored = [(e.stream_id, e.kind) for e in aof_client.handle(h.run_id).events(follow=False)]
        assert [(e.stream_id, e.kind) for e in received[h.run_id]] == stored
        assert stored[-1][1] == "Completed"


def test_requests_while_redis_is_down_are_answered_503_then_served(
    aof_client: Client, aof_server: RedisServer, api: ApiProcess
) -> None:
    key, _ = Tenants(aof_server.client(), Keys()).create_key(f"t-{uuid.uuid4().hex[:8]}")
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=api.url, headers=headers, timeout=30) as http:
        aof_server.stop(signal.SIGKILL)
        try:
            for method, path in [("GET", "/v1/runs"), ("POST", "/v1/runs"), ("GET", "/v1/runs/r1/events")]:
                body = {"agent": "one_hop", "input": "x"} if method == "POST" else None
                answer = http.request(method, path, json=body)
                assert answer.status_code == 503, (method, path, answer.text)
                assert answer.headers["retry-after"] == "1"
                assert answer.json()["error"]["kind"] == "unavailable"
        finally:
            aof_server.start()
        # Back: the same key (kept in the AOF) is served again.
        assert http.get("/v1/runs").status_code == 200
    assert "Traceback" not in api.log()
