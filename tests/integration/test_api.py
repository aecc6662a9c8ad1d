"""The HTTP API on a real uvicorn process, real workers and a real redis-server.

Runs submitted over HTTP complete; every error has the one shape and the right status; a tenant
sees and touches only its own runs, on every endpoint; listings page across hundreds of runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shared.keys import Keys
from shared.tenants import Tenants
from tests.api_support import ApiProcess, bearer, wait_status
from tests.broker import broker_env
from tests.conftest import InProcessCli
from tests.harness import ROOT, RedisServer, WorkerProcess

TIMEOUT = 60


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, workers: list[WorkerProcess]) -> Iterator[ApiProcess]:
    process = ApiProcess(redis_server.url, env={"WESICHAIN_API_KEEPALIVE_S": "0.5"}).start()
    yield process
    process.stop()


def new_key(redis_server: RedisServer, tenant: str) -> str:
    key, _ = Tenants(redis_server.client(), Keys()).create_key(tenant, "test")
    return key


@pytest.fixture
def tenant_a(api: ApiProcess, redis_server: RedisServer) -> Iterator[httpx.Client]:
    key = new_key(redis_server, f"a-{uuid.uuid4().hex[:8]}")
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
        yield http


@pytest.fixture
def tenant_b(api: ApiProcess, redis_server: RedisServer) -> Iterator[httpx.Client]:
    key = new_key(redis_server, f"b-{uuid.uuid4().hex[:8]}")
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
        yield http


def error_of(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"kind", "message", "details"}, body
    assert body["error"]["kind"] == kind, body
    assert body["error"]["message"]
    error: dict[str, Any] = body["error"]
    return error


def test_submit_over_http_and_complete(tenant_a: httpx.Client) -> None:
    response = tenant_a.post(
        "/v1/runs", json={"agent": "one_hop", "input": "add 1 and 2", "metadata": {"k": 1}}
    )
    assert response.status_code == 202, response.text
    run = response.json()
    assert (
        run["status"] in ("queued", "running") and run["agent"] == "one_hop" and run["metadata"] == {"k": 1}
    )
    done = wait_status(tenant_a, run["run_id"], {"completed", "failed", "interrupted"}, TIMEOUT)
    assert done["status"] == "completed" and done["answer"] == "1 + 2 = 3", done
    page = tenant_a.get(f"/v1/runs/{run['run_id']}/checkpoints").json()
    checkpoints = page["checkpoints"]
    assert [c["version"] for c in checkpoints] == list(range(1, done["version"] + 1))
    assert checkpoints[0]["status"] == "queued" and checkpoints[-1]["status"] == "completed"
    assert page["next_after_version"] is None
    # A page at a time: the same states.
    paged: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        part = tenant_a.get(
            f"/v1/runs/{run['run_id']}/checkpoints", params={"after_version": after, "limit": 2}
        ).json()
        paged.extend(part["checkpoints"])
        after = part["next_after_version"]
    assert paged == checkpoints


def test_errors_have_one_shape_and_the_right_status(api: ApiProcess, tenant_a: httpx.Client) -> None:
    anonymous = httpx.post(api.url + "/v1/runs", json={"agent": "direct", "input": "x"})
    assert error_of(anonymous, 401, "unauthorized") and anonymous.headers["www-authenticate"] == "Bearer"
    error_of(httpx.get(api.url + "/v1/runs", headers=bearer("wsk_not-a-key")), 401, "unauthorized")
    error_of(
        tenant_a.post(
            "/v1/runs", content=b'{"agent": "direct", "input": ', headers={"content-type": "application/json"}
        ),
        400,
        "bad_json",
    )
    error_of(tenant_a.post("/v1/runs", json={"agent": "direct"}), 422, "invalid_request")
    error_of(
        tenant_a.post("/v1/runs", json={"agent": "direct", "input": "x", "tenant": "b"}),
        422,
        "invalid_request",
    )
    error_of(tenant_a.post("/v1/runs", json={"agent": "direct", "input": "   "}), 422, "invalid_request")
    too_long = error_of(
        tenant_a.post("/v1/runs", json={"agent": "direct", "input": "x" * 32_001}), 422, "invalid_request"
    )
    assert "32000" in too_long["message"]
    error_of(
        tenant_a.post("/v1/runs", json={"agent": "direct", "input": "x", "metadata": {"m": "y" * 9000}}),
        422,
        "invalid_request",
    )
    unknown = error_of(
        tenant_a.post("/v1/runs", json={"agent": "nobody_serves_this", "input": "x"}), 422, "unknown_agent"
    )
    assert unknown["details"] == {"agent": "nobody_serves_this"}
    error_of(tenant_a.post("/v1/runs", json={"agent": "bad agent!", "input": "x"}), 422, "invalid_request")
    # Bodies over the limit, declared or chunked, are refused before they are read whole.
    big = json.dumps({"agent": "direct", "input": "x" * 300_000}).encode()
    error_of(
        tenant_a.post("/v1/runs", content=big, headers={"content-type": "application/json"}),
        413,
        "body_too_large",
    )
    chunks = iter([big[i : i + 65536] for i in range(0, len(big), 65536)])
    error_of(
        tenant_a.post("/v1/runs", content=chunks, headers={"content-type": "application/json"}),
        413,
        "body_too_large",
    )
    error_of(tenant_a.get("/v1/runs/no-such-run"), 404, "not_found")
    error_of(tenant_a.get("/v1/runs", params={"status": "sleeping"}), 422, "invalid_request")
    error_of(tenant_a.get("/v1/runs", params={"limit": 0}), 422, "invalid_request")
    error_of(tenant_a.get("/v1/runs", params={"cursor": "garbage"}), 422, "invalid_request")
    # Bounds the OpenAPI document states (a fuzzer found a 500 on a far-future `since`).
    error_of(tenant_a.get("/v1/runs", params={"since": "1.5e308"}), 422, "invalid_request")
    error_of(tenant_a.get("/v1/runs", params={"cursor": "9" * 300 + ".r"}), 422, "invalid_request")
    error_of(tenant_a.post("/v1/runs", json={"agent": "", "input": "x"}), 422, "invalid_request")
    error_of(tenant_a.post("/v1/runs/r1/deny", json={"always": True}), 422, "invalid_request")
    error_of(tenant_a.get("/v1/nothing-here"), 404, "not_found")
    # Approving a run that is not parked is a wrong state; so is cancelling one that ended.
    run = tenant_a.post("/v1/runs", json={"agent": "direct", "input": "x"}).json()
    done = wait_status(tenant_a, run["run_id"], {"completed"}, TIMEOUT)
    error_of(tenant_a.post(f"/v1/runs/{done['run_id']}/approve"), 409, "wrong_state")
    error_of(tenant_a.post(f"/v1/runs/{done['run_id']}/cancel"), 409, "wrong_state")


def test_tenants_cannot_see_or_touch_each_others_runs(tenant_a: httpx.Client, tenant_b: httpx.Client) -> None:
    parked = tenant_a.post(
        "/v1/runs", json={"agent": "needs_approval", "input": "refund", "thread_id": "t-1"}
    ).json()
    run_id = parked["run_id"]
    wait_status(tenant_a, run_id, {"awaiting_approval"}, TIMEOUT)
    for method, path in (
        ("GET", f"/v1/runs/{run_id}"),
        ("GET", f"/v1/runs/{run_id}/events"),
        ("GET", f"/v1/runs/{run_id}/checkpoints"),
        ("POST", f"/v1/runs/{run_id}/cancel"),
        ("POST", f"/v1/runs/{run_id}/approve"),
        ("POST", f"/v1/runs/{run_id}/deny"),
    ):
        response = tenant_b.request(method, path)
        missing = tenant_b.request(method, path.replace(run_id, "never-existed"))
        # Exactly what a run that does not exist gets, but for the id in the message.
        assert error_of(response, 404, "not_found")["message"] == f"no run {run_id!r}", (method, path)
        assert error_of(missing, 404, "not_found")
    streamed = tenant_b.get(f"/v1/runs/{run_id}/events", headers={"accept": "text/event-stream"})
    error_of(streamed, 404, "not_found")
    for params in ({}, {"thread_id": "t-1"}, {"agent": "needs_approval"}, {"status": "awaiting_approval"}):
        assert run_id not in [r["run_id"] for r in tenant_b.get("/v1/runs", params=params).json()["runs"]]
        assert run_id in [r["run_id"] for r in tenant_a.get("/v1/runs", params=params).json()["runs"]]
    # Nothing tenant B tried moved the run; tenant A can still decide it.
    assert tenant_a.get(f"/v1/runs/{run_id}").json()["status"] == "awaiting_approval"
    assert tenant_a.post(f"/v1/runs/{run_id}/approve", json={"note": "ok"}).status_code == 202
    done = wait_status(tenant_a, run_id, {"completed", "failed"}, TIMEOUT)
    assert done["status"] == "completed" and done["answer"].startswith("charged"), done


def test_deny_and_cancel(tenant_a: httpx.Client) -> None:
    denied = tenant_a.post("/v1/runs", json={"agent": "needs_approval", "input": "refund"}).json()
    wait_status(tenant_a, denied["run_id"], {"awaiting_approval"}, TIMEOUT)
    assert tenant_a.post(f"/v1/runs/{denied['run_id']}/deny", json={"note": "no"}).status_code == 202
    assert wait_status(tenant_a, denied["run_id"], {"completed"}, TIMEOUT)["answer"].startswith("denied")
    error_of(tenant_a.post(f"/v1/runs/{denied['run_id']}/deny", json={"nope": 1}), 422, "invalid_request")
    slow = tenant_a.post("/v1/runs", json={"agent": "slow_step", "input": "wait"}).json()
    wait_status(tenant_a, slow["run_id"], {"running"}, TIMEOUT)
    assert tenant_a.post(f"/v1/runs/{slow['run_id']}/cancel").status_code == 202
    assert (
        wait_status(tenant_a, slow["run_id"], {"interrupted", "completed"}, TIMEOUT)["status"]
        == "interrupted"
    )


def test_listing_pages_across_hundreds_of_runs(tenant_a: httpx.Client) -> None:
    submitted: list[str] = []
    for i in range(300):
        agent = "echo" if i % 3 == 0 else "direct"
        body = {"agent": agent, "input": f"run {i}", "thread_id": "paged" if i % 10 == 0 else None}
        response = tenant_a.post("/v1/runs", json={k: v for k, v in body.items() if v is not None})
        assert response.status_code == 202, response.text
        submitted.append(response.json()["run_id"])

    def everything(params: dict[str, Any]) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = []
        cursor = None
        for _ in range(100):
            page = tenant_a.get(
                "/v1/runs", params={**params, **({"cursor": cursor} if cursor else {})}
            ).json()
            assert len(page["runs"]) <= params["limit"]
            runs.extend(page["runs"])
            cursor = page["next_cursor"]
            if cursor is None:
                return runs
        raise AssertionError("the listing did not end")

    listed = everything({"limit": 37})
    ids = [r["run_id"] for r in listed]
    assert len(ids) == len(set(ids)) == 300 and set(ids) == set(submitted)
    created = [(r["created_at"], r["run_id"]) for r in listed]
    assert [c for c, _ in created] == sorted((c for c, _ in created), reverse=True)
    echo = everything({"limit": 50, "agent": "echo"})
    assert {r["run_id"] for r in echo} == {submitted[i] for i in range(0, 300, 3)}
    threaded = everything({"limit": 7, "thread_id": "paged"})
    assert [r["run_id"] for r in threaded] == [submitted[i] for i in range(290, -1, -10)]
    since = listed[99]["created_at"]
    assert {r["run_id"] for r in everything({"limit": 200, "since": since})} >= set(ids[:100])


def test_keys_cli_create_list_revoke(
    api: ApiProcess, redis_server: RedisServer, cli_in_process: InProcessCli
) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return cli_in_process("keys", *args, "--redis", redis_server.url, env=broker_env(redis_server.url))

    tenant = f"cli-{uuid.uuid4().hex[:6]}"
    # The installed entry point once, in a process of its own; the other commands in this one.
    created = subprocess.run(
        [sys.executable, "-m", "producer.cli", "keys", "create", "--tenant", tenant, "--name", "billing"]
        + ["--json", "--redis", redis_server.url],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, **broker_env(redis_server.url)},
    )
    assert created.returncode == 0, created.stderr
    record = json.loads(created.stdout)
    key = record["key"]
    assert key.startswith("wsk_") and record["tenant"] == tenant
    assert httpx.get(api.url + "/v1/runs", headers=bearer(key)).status_code == 200
    listed = json.loads(cli("list", "--tenant", tenant, "--json").stdout)
    assert [r["id"] for r in listed] == [record["id"]] and key not in json.dumps(listed)
    assert cli("revoke", "--tenant", "someone-else", record["id"]).returncode == 1
    revoked = cli("revoke", "--tenant", tenant, record["id"])
    assert revoked.returncode == 0, revoked.stderr
    error_of(httpx.get(api.url + "/v1/runs", headers=bearer(key)), 401, "unauthorized")


def test_health_and_readiness(api: ApiProcess) -> None:
    assert httpx.get(api.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(api.url + "/readyz")
    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert body["ready"] and body["redis"] and body["problems"] == []
    assert all(n >= 2 for n in body["queues"].values()), body


def test_agents_lists_what_live_workers_serve(tenant_a: httpx.Client) -> None:
    agents = {a["name"]: a for a in tenant_a.get("/v1/agents").json()["agents"]}
    assert {"direct", "one_hop", "needs_approval"} <= set(agents)
    add = next(t for t in agents["one_hop"]["tools"] if t["name"] == "add")
    assert add["parameters"]["properties"].keys() == {"a", "b"} and agents["one_hop"]["workers"] == 2
