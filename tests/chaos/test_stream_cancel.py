"""A cancel through the HTTP API racing a model that is streaming its answer, on real workers.

Each run's model streams a short piece of text every 10 ms; its token deltas are appended live
(``RunStore.emit``, ``emit_live.lua``) while followers read the run's events over SSE. The run is
cancelled mid-stream, with pieces still arriving. The run ends ``interrupted`` with exactly its
lifecycle events, no ``TokenDelta`` is stored after its ``Interrupted`` event (the model's late
text is dropped, not appended after the end), and every follower's stream ends at that event,
having seen exactly the stored events.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from functools import partial

import httpx
import pytest

from producer.client import Client
from shared.keys import Keys
from shared.tenants import Tenants
from tests.api_support import END, SSE, ApiProcess, bearer, frames, wait_status
from tests.chaos.support import RUN_TIMEOUT_S, Cluster, events_of
from tests.harness import RedisServer, wait_until
from tests.invariants import assert_event_invariants, kinds

#: Runs cancelled mid-stream, and followers per run.
RUNS = 4
FOLLOWERS = 2
#: Deltas each run has stored before it is cancelled.
DELTAS_FIRST = 3


@pytest.fixture
def api(server: RedisServer) -> Iterator[ApiProcess]:
    process = ApiProcess(server.url, env={"WESICHAIN_API_KEEPALIVE_S": "1"}).start()
    yield process
    process.stop()


class Follower:
    """Reads one run's events over SSE until the run's end event (or the stream's end)."""

    def __init__(self, api: ApiProcess, key: str, run_id: str) -> None:
        self.api, self.key, self.run_id = api, key, run_id
        self.seen: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.streaming = threading.Event()
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def _follow(self) -> None:
        try:
            with (
                httpx.Client(base_url=self.api.url, headers=bearer(self.key), timeout=30) as http,
                http.stream("GET", f"/v1/runs/{self.run_id}/events", headers=SSE) as answer,
            ):
                if answer.status_code != 200:
                    self.errors.append(f"{answer.status_code}: {answer.read()[:300]!r}")
                    return
                self.streaming.set()
                for frame in frames(answer):
                    if frame.data:
                        assert frame.id is not None
                        self.seen.append((frame.id, frame.event["kind"]))
                        if frame.event["kind"] in END:
                            return
        except Exception as exc:  # reported by the test, not lost in the thread
            self.errors.append(repr(exc))


def test_no_token_delta_follows_the_end_of_a_run_cancelled_mid_stream(
    cluster: Cluster, server: RedisServer, api: ApiProcess, client: Client
) -> None:
    cluster.start(2, concurrency=2)
    r = server.client()
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    key, _ = Tenants(r, Keys()).create_key(tenant)
    http = httpx.Client(base_url=api.url, headers=bearer(key), timeout=30)
    runs = [
        http.post("/v1/runs", json={"agent": "dripping", "input": "go"}).json()["run_id"] for _ in range(RUNS)
    ]
    followers = [Follower(api, key, run_id) for run_id in runs for _ in range(FOLLOWERS)]

    def stored(run_id: str) -> list[tuple[str, str]]:
        return [(e["id"], e["kind"]) for e in http.get(f"/v1/runs/{run_id}/events").json()["events"]]

    def streaming(run_id: str) -> bool:
        return [k for _, k in stored(run_id)].count("TokenDelta") >= DELTAS_FIRST

    for run_id in runs:
        wait_until(partial(streaming, run_id), RUN_TIMEOUT_S, what=f"{run_id} to stream")
    wait_until(lambda: all(f.streaming.is_set() for f in followers), 30, what="every follower to stream")
    for run_id in runs:
        answer = http.post(f"/v1/runs/{run_id}/cancel")
        assert answer.status_code == 202, answer.text

    for run_id in runs:
        assert wait_status(http, run_id, {"completed", "failed", "interrupted"}, RUN_TIMEOUT_S)["status"] == (
            "interrupted"
        )
    for f in followers:
        f.thread.join(RUN_TIMEOUT_S)
    assert not any(f.thread.is_alive() for f in followers), "a follower never saw its run end"
    assert [f.errors for f in followers if f.errors] == []
    # The workers gave their model calls up mid-stream (each stream closed at its next piece) and
    # serve new runs; whatever a late append of the cancelled runs would be has had its chance.
    after = [
        http.post("/v1/runs", json={"agent": "one_hop", "input": "go"}).json()["run_id"] for _ in range(4)
    ]
    for run_id in after:
        assert wait_status(http, run_id, {"completed", "failed", "interrupted"}, RUN_TIMEOUT_S)["status"] == (
            "completed"
        )

    for run_id in runs:
        events = events_of(client.handle(run_id))
        assert kinds(events) == ["RunStarted", "StepStarted", "Interrupted"]
        assert_event_invariants(events)
        ended = [e.kind for e in events].index("Interrupted")
        assert ended == len(events) - 1, [e.kind for e in events[ended:]]
        deltas = [e for e in events if e.kind == "TokenDelta"]
        assert len(deltas) >= DELTAS_FIRST and all(e.step == 1 for e in deltas)
        for f in followers:
            if f.run_id == run_id:
                assert f.seen == stored(run_id)
    http.close()
    assert "Traceback" not in api.log()
