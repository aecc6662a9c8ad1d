"""Custom events from tools on real workers and a real Redis: live over SSE, through the Python
client, filtered by kind, fenced in Redis, and kept to the run's tenant."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from producer.client import Client
from shared.events import CustomEvent, ToolCompleted
from shared.keys import Keys
from shared.state import Phase
from shared.tenants import Tenants
from tests.api_support import SSE, ApiProcess, Frame, bearer, frames
from tests.harness import RedisServer, WorkerProcess
from tests.invariants import assert_event_invariants

TIMEOUT = 60
PROGRESS = [{"done": i, "of": 5} for i in range(1, 6)]


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, workers: list[WorkerProcess]) -> Iterator[ApiProcess]:
    process = ApiProcess(redis_server.url).start()
    yield process
    process.stop()


def _tenant_client(api: ApiProcess, redis_server: RedisServer, name: str) -> httpx.Client:
    key, _ = Tenants(redis_server.client(), Keys()).create_key(f"{name}-{uuid.uuid4().hex[:8]}")
    return httpx.Client(base_url=api.url, headers=bearer(key), timeout=30)


@pytest.fixture
def http(api: ApiProcess, redis_server: RedisServer) -> Iterator[httpx.Client]:
    with _tenant_client(api, redis_server, "custom") as client:
        yield client


def _streamed(http: httpx.Client, run_id: str, **params: str) -> list[Frame]:
    with http.stream("GET", f"/v1/runs/{run_id}/events", headers=SSE, params=params) as response:
        assert response.status_code == 200
        return [f for f in frames(response) if f.data]


def _progress(data: object) -> dict[str, object]:
    assert isinstance(data, dict)
    return {k: v for k, v in data.items() if k != "pid"}


def test_a_tools_progress_arrives_over_sse_in_order_with_its_call_id_before_its_result(
    http: httpx.Client,
) -> None:
    run_id = http.post("/v1/runs", json={"agent": "progress", "input": "go"}).json()["run_id"]
    # The model's streamed text (TokenDelta) left aside: its chunking is the scripted model's.
    events = [f.event for f in _streamed(http, run_id) if f.event["kind"] != "TokenDelta"]
    kinds = [e["kind"] for e in events]
    assert kinds == [
        "RunStarted",
        "StepStarted",
        "ModelResponded",
        "ToolDispatched",
        *["CustomEvent"] * 5,
        "ToolCompleted",
        "StepStarted",
        "ModelResponded",
        "Completed",
    ]
    dispatched = events[3]
    custom = [e for e in events if e["kind"] == "CustomEvent"]
    completed = events[kinds.index("ToolCompleted")]
    assert [_progress(e["data"]) for e in custom] == PROGRESS
    assert {(e["call_id"], e["tool"], e["step"], e["name"], e["attempt"]) for e in custom} == {
        (dispatched["call_id"], "progress", 1, "progress", 1)
    }
    assert completed["call_id"] == dispatched["call_id"] and completed["attempt"] == 1
    # The ids are the stream's: strictly increasing, so the order is the order they were appended.
    ids = [tuple(int(p) for p in e["id"].split("-")) for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_the_stream_can_be_filtered_to_custom_events_and_still_ends_with_the_run(
    http: httpx.Client,
) -> None:
    run_id = http.post("/v1/runs", json={"agent": "progress", "input": "go"}).json()["run_id"]
    only = _streamed(http, run_id, kinds="CustomEvent,ToolCompleted")
    assert [f.event["kind"] for f in only] == ["CustomEvent"] * 5 + ["ToolCompleted", "Completed"]
    # The end event is always sent: it is how a follower knows the stream is over.
    custom = _streamed(http, run_id, kinds="CustomEvent")
    assert [f.event["kind"] for f in custom] == ["CustomEvent"] * 5 + ["Completed"]
    assert [_progress(f.event["data"]) for f in custom[:5]] == PROGRESS
    page = http.get(f"/v1/runs/{run_id}/events", params={"kinds": "CustomEvent", "limit": 3}).json()
    assert [e["kind"] for e in page["events"]] == ["CustomEvent"] * len(page["events"])
    for kinds in ("CustomEvent,<script>", ",,,", " "):
        bad = http.get(f"/v1/runs/{run_id}/events", params={"kinds": kinds})
        assert bad.status_code == 422 and bad.json()["error"]["kind"] == "invalid_request", kinds


def test_another_tenant_cannot_read_a_runs_custom_events(
    http: httpx.Client, api: ApiProcess, redis_server: RedisServer
) -> None:
    run_id = http.post("/v1/runs", json={"agent": "progress", "input": "go"}).json()["run_id"]
    assert [f.event["kind"] for f in _streamed(http, run_id, kinds="Completed")] == ["Completed"]
    with _tenant_client(api, redis_server, "attacker") as attacker:
        for headers in ({}, SSE):
            answer = attacker.get(
                f"/v1/runs/{run_id}/events", params={"kinds": "CustomEvent"}, headers=headers
            )
            assert answer.status_code == 404, answer.text
            assert "progress" not in answer.text


def test_the_python_client_iterates_custom_events_typed(client: Client) -> None:
    handle = client.submit("progress", "go")
    events = list(handle.events())
    custom = [e for e in events if isinstance(e, CustomEvent)]
    assert [_progress(e.data) for e in custom] == PROGRESS
    (completed,) = [e for e in events if isinstance(e, ToolCompleted)]
    assert {e.call_id for e in custom} == {completed.call_id}
    assert events.index(custom[-1]) < events.index(completed)
    assert handle.wait(TIMEOUT).phase is Phase.COMPLETED
    assert_event_invariants(events)
