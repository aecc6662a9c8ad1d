"""Queue namespaces over the HTTP API, on a real uvicorn process, a real redis-server and real
workers: one consuming only the default queues and one consuming only a namespace's.

A tenant allowed the namespace starts runs and pipeline runs in it over HTTP (raw, with both
Python clients and with the CLI): they complete, their heads and child runs record the namespace,
the namespace's worker received their tasks and the default worker none. A namespace the tenant is
not allowed is a 403 that starts nothing; a malformed one a 422.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from producer.api_client import ApiClient, AsyncClient, Forbidden
from producer.client import Client
from shared.keys import Keys
from shared.pipeline.store import child_run_id
from shared.state import Phase
from shared.tenants import Tenants
from tests.api_support import ApiProcess, bearer, wait_status
from tests.broker import Settings
from tests.conftest import own_store
from tests.harness import ROOT, RedisServer, WorkerProcess, wait_until
from tests.redis_cluster import RedisCluster

AGENTS = "tests.agents_pipelines"
NAMESPACE = "team-ns"
TIMEOUT = 90


@pytest.fixture(scope="module")
def server(redis_cluster: RedisCluster | None) -> Iterator[RedisServer]:
    with own_store(redis_cluster) as s:
        yield s


@pytest.fixture(scope="module")
def pool(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, WorkerProcess]]:
    log_dir = str(tmp_path_factory.mktemp("workers"))
    default = WorkerProcess("default", server.url, agents=AGENTS, concurrency=2, log_dir=log_dir)
    spaced = WorkerProcess(
        "spaced", server.url, agents=AGENTS, concurrency=2, log_dir=log_dir, namespaces=(NAMESPACE,)
    )
    default.start()
    try:
        spaced.start()
        try:
            yield {"default": default, "spaced": spaced}
        finally:
            spaced.stop()
    finally:
        default.stop()


@pytest.fixture(scope="module")
def api(server: RedisServer, pool: dict[str, WorkerProcess]) -> Iterator[ApiProcess]:
    process = ApiProcess(server.url, env={"WESICHAIN_AGENTS": AGENTS}).start()
    yield process
    process.stop()


def new_key(server: RedisServer, *allowed: str) -> tuple[str, str]:
    """A key of a new tenant allowed ``allowed`` (set before its first request, so no API process
    has its settings cached yet); the key and the tenant."""
    tenant = f"ns-{uuid.uuid4().hex[:8]}"
    tenants = Tenants(server.client(), Keys())
    key, _ = tenants.create_key(tenant, "test")
    if allowed:
        tenants.set_namespaces(tenant, allowed)
    return key, tenant


@pytest.fixture
def allowed(api: ApiProcess, server: RedisServer) -> Iterator[httpx.Client]:
    key, _ = new_key(server, NAMESPACE)
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
        yield http


def error_of(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"kind", "message", "details"}, body
    assert body["error"]["kind"] == kind, body
    error: dict[str, Any] = body["error"]
    return error


def namespace_of(server: RedisServer, run_id: str) -> str | None:
    client = Client(Settings(redis_url=server.url))
    try:
        head = client.store.load(run_id)
    finally:
        client.close()
    assert head is not None, run_id
    return head.namespace


def ran_only_on_the_namespace(pool: dict[str, WorkerProcess], task_id_part: str) -> None:
    assert pool["spaced"].received(task_id_part), task_id_part
    assert not pool["default"].received(task_id_part), task_id_part


def test_a_run_started_over_http_in_an_allowed_namespace_runs_on_that_namespace_s_worker_only(
    allowed: httpx.Client, server: RedisServer, pool: dict[str, WorkerProcess]
) -> None:
    started = allowed.post("/v1/runs", json={"agent": "worker", "input": "spaced", "namespace": NAMESPACE})
    assert started.status_code == 202, started.text
    assert started.json()["namespace"] == NAMESPACE
    run_id = started.json()["run_id"]
    done = wait_status(allowed, run_id, {"completed", "failed", "interrupted"}, TIMEOUT)
    assert (done["status"], done["answer"], done["namespace"]) == ("completed", "done spaced", NAMESPACE)
    assert namespace_of(server, run_id) == NAMESPACE  # stored with the request: recovery keeps it
    ran_only_on_the_namespace(pool, run_id)
    # Naming the default namespace, or none, is every tenant's and runs on the default queues.
    for body in ({"namespace": "wesichain"}, {}):
        plain = allowed.post("/v1/runs", json={"agent": "worker", "input": "plain", **body}).json()
        ended = wait_status(allowed, plain["run_id"], {"completed", "failed", "interrupted"}, TIMEOUT)
        assert (ended["status"], ended["namespace"]) == ("completed", None)
        assert pool["default"].received(plain["run_id"]) and not pool["spaced"].received(plain["run_id"])


def test_a_namespace_the_tenant_is_not_allowed_is_a_403_that_starts_nothing(
    api: ApiProcess, server: RedisServer
) -> None:
    other_key, _ = new_key(server, "someone-else")
    for key, allowed_list in ((new_key(server)[0], []), (other_key, ["someone-else"])):
        with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
            refused = error_of(
                http.post("/v1/runs", json={"agent": "worker", "input": "x", "namespace": NAMESPACE}),
                403,
                "forbidden",
            )
            assert refused["details"] == {"namespace": NAMESPACE, "allowed": allowed_list}
            piped = error_of(
                http.post("/v1/pipelines", json={"pipeline": "chain", "input": "x", "namespace": NAMESPACE}),
                403,
                "forbidden",
            )
            assert piped["details"]["namespace"] == NAMESPACE
            assert http.get("/v1/runs").json()["runs"] == []
            assert http.get("/v1/pipelines").json()["pipelines"] == []
            for bad in ("a.b", "", "x" * 49):
                error_of(
                    http.post("/v1/runs", json={"agent": "worker", "input": "x", "namespace": bad}),
                    422,
                    "invalid_request",
                )
                error_of(
                    http.post("/v1/pipelines", json={"pipeline": "chain", "input": "x", "namespace": bad}),
                    422,
                    "invalid_request",
                )
    with ApiClient(api.url, other_key) as client, pytest.raises(Forbidden) as raised:
        client.submit("worker", "x", namespace=NAMESPACE)
    assert (raised.value.status, raised.value.details["namespace"]) == (403, NAMESPACE)


def test_both_python_clients_and_the_cli_start_runs_in_a_namespace(
    api: ApiProcess, server: RedisServer, pool: dict[str, WorkerProcess]
) -> None:
    key, _ = new_key(server, NAMESPACE)
    with ApiClient(api.url, key) as client:
        synced = client.submit("worker", "sync", namespace=NAMESPACE)
        head = synced.wait(timeout=TIMEOUT)
    assert (head.phase, head.answer, head.namespace) == (Phase.COMPLETED, "done sync", NAMESPACE)

    async def started_async() -> tuple[str, Phase, str | None]:
        async with AsyncClient(api.url, key) as aclient:
            handle = await aclient.submit("worker", "async", namespace=NAMESPACE, idempotency_key="a-1")
            again = await aclient.submit("worker", "async", namespace=NAMESPACE, idempotency_key="a-1")
            assert again.run_id == handle.run_id
            ended = await handle.wait(timeout=TIMEOUT)
            return handle.run_id, ended.phase, ended.namespace

    async_id, phase, namespace = asyncio.run(started_async())
    assert (phase, namespace) == (Phase.COMPLETED, NAMESPACE)

    env = {**os.environ, "PYTHONPATH": str(ROOT), "WESICHAIN_API_KEY": key}
    env.pop("WESICHAIN_REDIS_URL", None)
    submitted = subprocess.run(
        [sys.executable, "-m", "producer.cli", "submit", "worker", "cli", "--api", api.url]
        + ["--namespace", NAMESPACE, "--wait", "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=env,
    )
    assert submitted.returncode == 0, submitted.stderr
    last = json.loads(submitted.stdout.splitlines()[-1])
    assert (last["answer"], last["namespace"]) == ("done cli", NAMESPACE)
    for run_id in (synced.run_id, async_id, last["run_id"]):
        assert namespace_of(server, run_id) == NAMESPACE
        ran_only_on_the_namespace(pool, run_id)


def test_a_pipeline_run_in_a_namespace_runs_every_child_and_move_on_that_namespace_s_worker(
    allowed: httpx.Client, server: RedisServer, pool: dict[str, WorkerProcess]
) -> None:
    pid = f"nsp-{uuid.uuid4().hex[:8]}"
    body = {"pipeline": "fan", "input": "a,b,c", "pipeline_id": pid, "namespace": NAMESPACE}
    started = allowed.post("/v1/pipelines", json=body)
    assert started.status_code == 202, started.text
    assert started.json()["namespace"] == NAMESPACE

    def ended() -> dict[str, Any] | None:
        status: dict[str, Any] = allowed.get(f"/v1/pipelines/{pid}").json()
        return status if status["status"] != "running" else None

    status = wait_until(ended, timeout=TIMEOUT, interval=0.1, what=f"pipeline run {pid} to end")
    assert status["status"] == "completed", status
    assert status["output"] == "0:done a | 1:done b | 2:done c"
    children = [child["run_id"] for step in status["steps"] for child in step["children"]]
    stored = children[0].removesuffix(":s0:i0:a0")  # the tenant's own id space: t<digest>.ID
    assert stored.startswith("t") and stored.endswith(f".{pid}")
    assert children == [child_run_id(stored, 0, 0, 0), *(child_run_id(stored, 1, i, 0) for i in range(3))] + [
        child_run_id(stored, 2, 0, 0)
    ]
    for run_id in children:
        assert namespace_of(server, run_id) == NAMESPACE
        assert allowed.get(f"/v1/runs/{run_id}").json()["namespace"] == NAMESPACE
    ran_only_on_the_namespace(pool, stored)  # every child run's tasks
    assert f"[pipe:{stored}:advance" in pool["spaced"].log()  # its first move too
    assert f"pipe:{stored}" not in pool["default"].log()
    listed = allowed.get("/v1/pipelines", params={"pipeline": "fan"}).json()["pipelines"]
    assert [(p["pipeline_id"], p["namespace"]) for p in listed] == [(pid, NAMESPACE)]
    # The same id and request again is the same pipeline run; in another namespace, a conflict.
    assert allowed.post("/v1/pipelines", json=body).json()["status"] == "completed"
    other = allowed.post("/v1/pipelines", json={**body, "namespace": "wesichain"})
    error_of(other, 409, "conflict")
