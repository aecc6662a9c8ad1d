"""``/v1/pipelines`` on a real uvicorn process, real workers and a real redis-server: start,
follow, cancel, events, errors, and a tenant sees only its own pipeline runs and their children."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from producer.api_client import ApiClient
from shared.keys import Keys
from shared.pipeline.store import child_run_id
from shared.tenants import TenantLimits, Tenants
from tests.api_support import ApiProcess, bearer
from tests.conftest import own_store
from tests.harness import RedisServer, WorkerProcess, wait_until
from tests.redis_cluster import RedisCluster

AGENTS = "tests.agents_pipelines"


@pytest.fixture(scope="module")
def server(redis_cluster: RedisCluster | None) -> Iterator[RedisServer]:
    with own_store(redis_cluster) as s:  # the shared cluster with --store cluster
        yield s


@pytest.fixture(scope="module")
def api(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiProcess]:
    worker = WorkerProcess(
        "pa1", server.url, agents=AGENTS, concurrency=3, log_dir=str(tmp_path_factory.mktemp("w"))
    ).start()
    process = ApiProcess(server.url, env={"WESICHAIN_AGENTS": AGENTS}).start()
    yield process
    process.stop()
    worker.stop()


def _tenant(api: ApiProcess, server: RedisServer) -> httpx.Client:
    key, _ = Tenants(server.client(), Keys()).create_key(f"t-{uuid.uuid4().hex[:8]}", "test")
    return httpx.Client(base_url=api.url, headers=bearer(key), timeout=30)


@pytest.fixture
def tenant_a(api: ApiProcess, server: RedisServer) -> Iterator[httpx.Client]:
    with _tenant(api, server) as http:
        yield http


@pytest.fixture
def tenant_b(api: ApiProcess, server: RedisServer) -> Iterator[httpx.Client]:
    with _tenant(api, server) as http:
        yield http


def ended(http: httpx.Client, pipeline_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = http.get(f"/v1/pipelines/{pipeline_id}").json()
        if body["status"] != "running" or time.monotonic() > deadline:
            return body
        time.sleep(0.1)


def error_kind(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    return str(response.json()["error"]["kind"])


def test_pipeline_over_http(tenant_a: httpx.Client, tenant_b: httpx.Client) -> None:
    pid = f"http-{uuid.uuid4().hex[:8]}"
    started = tenant_a.post("/v1/pipelines", json={"pipeline": "chain", "input": "web", "pipeline_id": pid})
    assert started.status_code == 202, started.text
    assert started.json()["pipeline_id"] == pid
    body = ended(tenant_a, pid)
    assert (body["status"], body["output"]) == ("completed", "done again done web")
    # Its children are the tenant's runs; another tenant sees neither them nor the pipeline run.
    stored = body["steps"][0]["children"][0]["run_id"].removesuffix(":s0:i0:a0")
    assert stored.endswith(f".{pid}")  # ids are the tenant's own: stored under its digest
    child = child_run_id(stored, 1, 0, 0)
    assert tenant_a.get(f"/v1/runs/{child}").json()["status"] == "completed"
    assert error_kind(tenant_b.get(f"/v1/runs/{child}"), 404) == "not_found"
    assert error_kind(tenant_b.get(f"/v1/pipelines/{pid}"), 404) == "not_found"
    assert error_kind(tenant_b.post(f"/v1/pipelines/{pid}/cancel"), 404) == "not_found"
    events = tenant_a.get(f"/v1/pipelines/{pid}/events").json()
    kinds = [e["kind"] for e in events["events"]]
    assert kinds[0] == "pipeline_started" and kinds[-1] == "pipeline_completed"
    assert [e["run_id"] for e in events["events"] if e["kind"] == "child_started"] == [
        child_run_id(stored, 0, 0, 0),
        child,
    ]
    after = tenant_a.get(f"/v1/pipelines/{pid}/events", params={"after": events["events"][2]["id"]}).json()
    assert [e["id"] for e in after["events"]] == [e["id"] for e in events["events"][3:]]
    # Past what Redis reads as a stream id: a 422, not Redis's error as a 500.
    for huge in ("99999999999999999999999-0", "18446744073709551616-0", "0-99999999999999999999999999"):
        too_far = tenant_a.get(f"/v1/pipelines/{pid}/events", params={"after": huge})
        assert error_kind(too_far, 422) == "invalid_request", huge
    assert error_kind(tenant_a.post(f"/v1/pipelines/{pid}/cancel"), 409) == "wrong_state"
    # The same id and request again: the same pipeline run; with another request: 409.
    again = tenant_a.post("/v1/pipelines", json={"pipeline": "chain", "input": "web", "pipeline_id": pid})
    assert again.status_code == 202 and again.json()["status"] == "completed"
    other = tenant_a.post("/v1/pipelines", json={"pipeline": "chain", "input": "other", "pipeline_id": pid})
    assert error_kind(other, 409) == "conflict"


def test_cancel_over_http(tenant_a: httpx.Client) -> None:
    items = ",".join(f"slow h{i}" for i in range(30))
    pid = tenant_a.post("/v1/pipelines", json={"pipeline": "fan", "input": items}).json()["pipeline_id"]
    deadline = time.monotonic() + 60
    while not [s for s in tenant_a.get(f"/v1/pipelines/{pid}").json()["steps"] if s["kind"] == "map"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    cancelled = tenant_a.post(f"/v1/pipelines/{pid}/cancel")
    assert cancelled.status_code == 202, cancelled.text
    assert cancelled.json()["status"] == "cancelled"


def test_bad_requests(tenant_a: httpx.Client) -> None:
    assert error_kind(tenant_a.post("/v1/pipelines", json={"pipeline": "nope", "input": "x"}), 422) == (
        "unknown_pipeline"
    )
    assert error_kind(tenant_a.post("/v1/pipelines", json={"pipeline": "words", "input": "x"}), 422) == (
        "invalid_request"
    )
    assert error_kind(tenant_a.post("/v1/pipelines", json={"input": "x"}), 422) == "invalid_request"
    # An id is one segment of the pipeline run's paths: one with '/' no path would reach, and one
    # with '..' segments would name another pipeline run in a client that joins it to a path.
    for pid in ("a/b", "h/../other"):
        refused = tenant_a.post(
            "/v1/pipelines", json={"pipeline": "chain", "input": "web", "pipeline_id": pid}
        )
        assert (
            error_kind(refused, 422) == "invalid_request" and "no '/'" in refused.json()["error"]["message"]
        )
    assert [
        p["pipeline_id"] for p in tenant_a.get("/v1/pipelines").json()["pipelines"] if "/" in p["pipeline_id"]
    ] == []
    assert error_kind(tenant_a.get("/v1/pipelines/missing"), 404) == "not_found"
    bad_after = tenant_a.get("/v1/pipelines/missing/events", params={"after": "x"})
    assert error_kind(bad_after, 422) == "invalid_request"


def test_pipeline_runs_are_listed_per_tenant_newest_first_and_paged(
    api: ApiProcess, tenant_a: httpx.Client, tenant_b: httpx.Client
) -> None:
    mine = []
    for word in ("one", "two", "three"):  # one after the other: each is created after the last
        started = tenant_a.post("/v1/pipelines", json={"pipeline": "chain", "input": word})
        assert started.status_code == 202, started.text
        mine.append(started.json()["pipeline_id"])
        assert ended(tenant_a, mine[-1])["status"] == "completed"
    theirs = tenant_b.post("/v1/pipelines", json={"pipeline": "chain", "input": "b"}).json()["pipeline_id"]
    # Newest first, two a page; another tenant's pipeline run is never listed.
    first = tenant_a.get("/v1/pipelines", params={"limit": 2}).json()
    assert [p["pipeline_id"] for p in first["pipelines"]] == mine[::-1][:2]
    second = tenant_a.get("/v1/pipelines", params={"limit": 2, "cursor": first["next_cursor"]}).json()
    assert [p["pipeline_id"] for p in second["pipelines"]] == mine[:1]
    listed_b = tenant_b.get("/v1/pipelines").json()
    assert [p["pipeline_id"] for p in listed_b["pipelines"]] == [theirs] and listed_b["next_cursor"] is None
    summary = second["pipelines"][0]
    assert (summary["name"], summary["status"], summary["input"], summary["error"]) == (
        "chain",
        "completed",
        "one",
        None,
    )
    assert summary["total"] == summary["done"] and summary["finished_at"] >= summary["created_at"]
    # Filters, and the Python client over HTTP.
    assert tenant_a.get("/v1/pipelines", params={"status": "running"}).json()["pipelines"] == []
    assert tenant_a.get("/v1/pipelines", params={"pipeline": "fan"}).json()["pipelines"] == []
    key = tenant_a.headers["authorization"].removeprefix("Bearer ")
    with ApiClient(api.url, key) as client:
        page = client.list_pipelines(pipeline="chain", status="completed", limit=50)
    assert [p.pipeline_id for p in page.pipelines] == mine[::-1] and page.next_cursor is None
    assert error_kind(tenant_a.get("/v1/pipelines", params={"cursor": "nope"}), 422) == "invalid_request"
    assert error_kind(tenant_a.get("/v1/pipelines", params={"status": "lost"}), 422) == "invalid_request"


def test_a_tenants_pipeline_children_stay_within_its_in_flight_limit(
    api: ApiProcess, server: RedisServer
) -> None:
    """Each child run of a pipeline run is a run of its tenant: it takes its place under the
    tenant's limits as a submit does, and waits (its item taken) while there is none. Two map
    steps of eight once ran sixteen children at once under a limit of two."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    tenants = Tenants(server.client(), Keys())
    key, _ = tenants.create_key(name, "test")
    tenants.set_limits(name, TenantLimits(max_inflight=2))
    r = server.client()

    def in_flight() -> int:
        return sum(int(r.hget(Keys().inflight(shard), name) or 0) for shard in range(Keys().shards))

    items = ",".join(f"slow {i}" for i in range(8))
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
        ids = []
        for n in range(2):
            body = {"pipeline": "fan", "input": items, "pipeline_id": f"p{n}"}

            def accepted(body: dict[str, str] = body) -> str | None:
                # A pipeline run's submit needs room too: the first one's children may fill it.
                answer = http.post("/v1/pipelines", json=body)
                assert answer.status_code in (202, 429), answer.text
                return str(answer.json()["pipeline_id"]) if answer.status_code == 202 else None

            ids.append(wait_until(accepted, 120, interval=0.05, what="room for the pipeline run"))
        peak = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            peak = max(peak, in_flight())
            statuses = [http.get(f"/v1/pipelines/{pid}").json()["status"] for pid in ids]
            if "running" not in statuses:
                break
        assert statuses == ["completed", "completed"], statuses
        assert 1 <= peak <= 2, peak
        # Every item ran once, in its own child run.
        for pid in ids:
            assert ended(http, pid)["output"].count("done slow") == 8
