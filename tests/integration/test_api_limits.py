"""Submitting over HTTP under limits: idempotent resubmits, per-tenant submits per minute and runs
in flight (429 with Retry-After), completion callbacks named in the submit, and auth turned off
only on loopback. Real uvicorn process, real workers, real redis-server."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from producer.client import Client
from shared.keys import Keys
from shared.tenants import TenantLimits, Tenants
from tests.api_support import ApiProcess, bearer, wait_status
from tests.broker import Settings, broker_env
from tests.harness import ROOT, RedisServer, WorkerProcess, wait_until

TIMEOUT = 60


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, workers: list[WorkerProcess]) -> Iterator[ApiProcess]:
    process = ApiProcess(redis_server.url).start()
    yield process
    process.stop()


def tenant_client(api: ApiProcess, redis_server: RedisServer, tenant: str) -> httpx.Client:
    key, _ = Tenants(redis_server.client(), Keys()).create_key(tenant)
    return httpx.Client(base_url=api.url, headers=bearer(key), timeout=30)


def set_limits(redis_server: RedisServer, tenant: str, *flags: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "producer.cli", "keys", "limits", "--tenant", tenant, *flags],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={
            "WESICHAIN_REDIS_URL": redis_server.url,
            "PATH": "/usr/bin:/bin",
            **broker_env(redis_server.url),
        },
    )
    assert done.returncode == 0, done.stderr
    limits: dict[str, Any] = json.loads(done.stdout)
    return limits


def allow_celery_callbacks(redis_server: RedisServer, tenant: str, task: str, queue: str) -> None:
    """What an operator does before a tenant may name a Celery callback (``keys celery-callbacks``)."""
    done = subprocess.run(
        [sys.executable, "-m", "producer.cli", "keys", "celery-callbacks", "--tenant", tenant]
        + ["--allow-task", task, "--allow-queue", queue],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={
            "WESICHAIN_REDIS_URL": redis_server.url,
            "PATH": "/usr/bin:/bin",
            **broker_env(redis_server.url),
        },
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"tasks": [task], "queues": [queue]}


def test_idempotent_resubmit_returns_the_same_run(api: ApiProcess, redis_server: RedisServer) -> None:
    with tenant_client(api, redis_server, f"idem-{uuid.uuid4().hex[:6]}") as http:
        body = {"agent": "direct", "input": "once only", "metadata": {"order": 7}}
        headers = {"Idempotency-Key": "order-7"}
        first = http.post("/v1/runs", json=body, headers=headers)
        again = http.post("/v1/runs", json=body, headers=headers)
        assert first.status_code == again.status_code == 202, again.text
        assert first.json()["run_id"] == again.json()["run_id"]
        wait_status(http, first.json()["run_id"], {"completed"}, TIMEOUT)
        after_end = http.post("/v1/runs", json=body, headers=headers)
        assert (
            after_end.json()["run_id"] == first.json()["run_id"] and after_end.json()["status"] == "completed"
        )
        conflict = http.post("/v1/runs", json={**body, "input": "another"}, headers=headers)
        assert conflict.status_code == 409 and conflict.json()["error"]["kind"] == "conflict"
        assert [r["run_id"] for r in http.get("/v1/runs").json()["runs"]] == [first.json()["run_id"]]
        bad = http.post("/v1/runs", json=body, headers={"Idempotency-Key": "k" * 256})
        assert bad.status_code == 422


def test_submits_per_minute_are_limited_with_retry_after(api: ApiProcess, redis_server: RedisServer) -> None:
    tenant = f"rate-{uuid.uuid4().hex[:6]}"
    # Every limit is printed: the one set, the others at their defaults.
    assert set_limits(redis_server, tenant, "--submits-per-minute", "5") == {
        **TenantLimits().model_dump(),
        "submits_per_minute": 5,
    }
    with tenant_client(api, redis_server, tenant) as http:
        accepted = [
            http.post(
                "/v1/runs", json={"agent": "direct", "input": "x"}, headers={"Idempotency-Key": f"r{i}"}
            )
            for i in range(5)
        ]
        assert [r.status_code for r in accepted] == [202] * 5
        refused = http.post("/v1/runs", json={"agent": "direct", "input": "x"})
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["kind"] == "rate_limited" and error["details"]["limit"] == 5
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        # A retry of a submit that was accepted is answered: it starts nothing.
        replay = http.post(
            "/v1/runs", json={"agent": "direct", "input": "x"}, headers={"Idempotency-Key": "r0"}
        )
        assert replay.status_code == 202 and replay.json()["run_id"] == accepted[0].json()["run_id"]
        assert len(http.get("/v1/runs").json()["runs"]) == 5
    # Another tenant is not limited by this one's submits.
    with tenant_client(api, redis_server, f"other-{uuid.uuid4().hex[:6]}") as other:
        assert other.post("/v1/runs", json={"agent": "direct", "input": "x"}).status_code == 202


def test_a_submit_refused_for_its_agent_spends_none_of_the_tenants_submits(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    """A submit naming an agent no worker serves is refused (422 ``unknown_agent``) before it counts
    in the tenant's submit window, whichever way the API serves it (with an idempotency key, a
    worker thread): refusals of the caller's own mistakes do not use up its submits."""
    tenant = f"agent-{uuid.uuid4().hex[:6]}"
    set_limits(redis_server, tenant, "--submits-per-minute", "2")
    with tenant_client(api, redis_server, tenant) as http:
        for i in range(4):
            headers = {"Idempotency-Key": f"u{i}"} if i % 2 else {}
            refused = http.post(
                "/v1/runs", json={"agent": "nobody-serves-this", "input": "x"}, headers=headers
            )
            assert refused.status_code == 422 and refused.json()["error"]["kind"] == "unknown_agent"
        accepted = [http.post("/v1/runs", json={"agent": "direct", "input": f"{i}"}) for i in range(2)]
        assert [r.status_code for r in accepted] == [202, 202], [r.text for r in accepted]
        over = http.post("/v1/runs", json={"agent": "direct", "input": "x"})
        assert over.status_code == 429 and over.json()["error"]["kind"] == "rate_limited"


def test_runs_in_flight_are_limited(api: ApiProcess, redis_server: RedisServer) -> None:
    tenant = f"inflight-{uuid.uuid4().hex[:6]}"
    set_limits(redis_server, tenant, "--max-inflight", "2")
    with tenant_client(api, redis_server, tenant) as http:
        parked = [
            http.post("/v1/runs", json={"agent": "needs_approval", "input": "x"}).json() for _ in range(2)
        ]
        refused = http.post("/v1/runs", json={"agent": "direct", "input": "x"})
        assert refused.status_code == 429 and refused.json()["error"]["kind"] == "too_many_in_flight"
        assert refused.json()["error"]["details"] == {"limit": 2, "in_flight": 2}
        assert refused.headers["retry-after"] == "5"
        wait_status(http, parked[0]["run_id"], {"awaiting_approval"}, TIMEOUT)
        assert http.post(f"/v1/runs/{parked[0]['run_id']}/cancel").status_code == 202
        wait_status(http, parked[0]["run_id"], {"interrupted"}, TIMEOUT)
        # The ended run gave its place back.
        assert http.post("/v1/runs", json={"agent": "direct", "input": "x"}).status_code == 202
        wait_status(http, parked[1]["run_id"], {"awaiting_approval"}, TIMEOUT)
        assert http.post(f"/v1/runs/{parked[1]['run_id']}/cancel").status_code == 202


@pytest.mark.redis_broker  # reads the callback's message from kombu's Redis list
def test_celery_callback_named_in_the_submit_is_sent_once(api: ApiProcess, redis_server: RedisServer) -> None:
    queue = f"billing-{uuid.uuid4().hex[:6]}"
    tenant = f"cb-{uuid.uuid4().hex[:6]}"
    allow_celery_callbacks(redis_server, tenant, "billing.on_agent_done", queue)
    with tenant_client(api, redis_server, tenant) as http:
        callback = {"task": "billing.on_agent_done", "queue": queue}
        run = http.post("/v1/runs", json={"agent": "direct", "input": "x", "callback": callback}).json()
        assert run["callback"] == {"task": "billing.on_agent_done", "queue": queue, "url": None}
        done = wait_status(http, run["run_id"], {"completed"}, TIMEOUT)

        def delivered() -> dict[str, Any] | None:
            view: dict[str, Any] = http.get(f"/v1/runs/{done['run_id']}").json()
            return view if (view["callback_delivery"] or {}).get("status") == "delivered" else None

        view = wait_until(delivered, timeout=TIMEOUT, what="the callback to be delivered")
        assert view["callback_delivery"]["attempts"] == 1
        # The message waits in the named queue (kombu's Redis list of that name), sent once.
        messages = redis_server.client().lrange(queue, 0, -1)
        assert len(messages) == 1
        envelope = json.loads(messages[0])
        assert envelope["headers"]["task"] == "billing.on_agent_done"
        args, _, _ = json.loads(base64.b64decode(envelope["body"]))
        assert args[0]["run_id"] == run["run_id"] and args[0]["status"] == "completed"
        # A webhook to a loopback address is refused when the run is submitted.
        refused = http.post(
            "/v1/runs", json={"agent": "direct", "input": "x", "callback": {"url": "http://127.0.0.1:9/hook"}}
        )
        assert refused.status_code == 422 and "not a public address" in refused.json()["error"]["message"]


def test_a_tenants_default_webhook_applies_to_runs_that_name_none(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    tenant = f"default-{uuid.uuid4().hex[:6]}"
    env = {"WESICHAIN_REDIS_URL": redis_server.url, "PATH": "/usr/bin:/bin", **broker_env(redis_server.url)}
    command = [sys.executable, "-m", "producer.cli", "keys", "callback", "--tenant", tenant]
    set_default = subprocess.run(
        [*command, "--url", "http://127.0.0.1:9/hook"], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert set_default.returncode == 0 and set_default.stdout.strip() == "http://127.0.0.1:9/hook"
    queue = f"q-{uuid.uuid4().hex[:6]}"
    allow_celery_callbacks(redis_server, tenant, "billing.on_agent_done", queue)
    with tenant_client(api, redis_server, tenant) as http:
        # The default is checked like a callback of the run's own: this one reaches loopback.
        refused = http.post("/v1/runs", json={"agent": "direct", "input": "x"})
        assert refused.status_code == 422 and "not a public address" in refused.json()["error"]["message"]
        own = {"task": "billing.on_agent_done", "queue": queue}
        accepted = http.post("/v1/runs", json={"agent": "direct", "input": "x", "callback": own})
        assert accepted.status_code == 202 and accepted.json()["callback"]["task"] == "billing.on_agent_done"
        cleared = subprocess.run([*command, "--clear"], capture_output=True, text=True, cwd=ROOT, env=env)
        assert cleared.stdout.strip() == "none"

        def accepted_without() -> httpx.Response | None:  # an API process rereads it within 5 s
            response = http.post("/v1/runs", json={"agent": "direct", "input": "x"})
            return response if response.status_code == 202 else None

        plain = wait_until(accepted_without, timeout=TIMEOUT, interval=0.5, what="the default to be cleared")
        assert plain.json()["callback"] is None


def test_auth_is_off_only_on_loopback(redis_server: RedisServer, workers: list[WorkerProcess]) -> None:
    public = subprocess.run(
        [
            sys.executable,
            "-m",
            "producer.cli",
            "api",
            "--no-auth",
            "--host",
            "0.0.0.0",
            "--redis",
            redis_server.url,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert public.returncode == 2 and "only on a loopback address" in public.stderr
    local = ApiProcess(redis_server.url, args=("--no-auth",)).start()
    try:
        with httpx.Client(base_url=local.url, timeout=30) as http:
            run = http.post("/v1/runs", json={"agent": "direct", "input": "x"}).json()
            assert wait_status(http, run["run_id"], {"completed"}, TIMEOUT)["answer"] == "The answer is 42."
            # The operator's view: the runs without a tenant, not the tenants' runs.
            client = Client(Settings(redis_url=redis_server.url))
            try:
                theirs = client.submit("direct", "x", tenant="somebody").run_id
            finally:
                client.close()
            assert http.get(f"/v1/runs/{theirs}").status_code == 404
            ids = [r["run_id"] for r in http.get("/v1/runs").json()["runs"]]
            assert run["run_id"] in ids and theirs not in ids
    finally:
        local.stop()


def test_a_bulk_retry_waits_for_room_under_the_tenants_in_flight_limit(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    tenant = f"bulk-{uuid.uuid4().hex[:6]}"
    set_limits(redis_server, tenant, "--max-inflight", "1")
    with tenant_client(api, redis_server, tenant) as http:

        def parked_then_cancelled() -> dict[str, Any]:
            run = http.post("/v1/runs", json={"agent": "needs_approval", "input": "x"}).json()
            wait_status(http, run["run_id"], {"awaiting_approval"}, TIMEOUT)
            assert http.post(f"/v1/runs/{run['run_id']}/cancel").status_code == 202
            return wait_status(http, run["run_id"], {"interrupted"}, TIMEOUT)

        originals = [parked_then_cancelled() for _ in range(2)]
        # The job's runs only: its retries are created after the originals, past this bound.
        until = originals[-1]["created_at"] + 0.1
        wait_until(lambda: time.time() > until, TIMEOUT, what="the bound to pass")
        query = {"agent": "needs_approval", "until": until}
        job = http.post("/v1/bulk", json={"action": "retry", "query": query, "rate_per_s": 50})
        assert job.status_code == 202, job.text
        job_id = job.json()["job_id"]
        known = {r["run_id"] for r in originals}

        def next_retry() -> dict[str, Any] | None:
            listed = http.get("/v1/runs", params={"agent": "needs_approval"}).json()["runs"]
            new = [r for r in listed if r["run_id"] not in known and r["status"] == "awaiting_approval"]
            return new[0] if new else None

        retries = []
        for _ in originals:
            # Each retry waits until the one before has given its place back.
            retry = wait_until(next_retry, TIMEOUT, interval=0.1, what="the next retry to park")
            known.add(retry["run_id"])
            assert http.post(f"/v1/runs/{retry['run_id']}/cancel").status_code == 202
            retries.append(wait_status(http, retry["run_id"], {"interrupted"}, TIMEOUT))
        wait_until(lambda: http.get(f"/v1/bulk/{job_id}").json()["status"] == "done", TIMEOUT, what="the job")
        outcomes = http.get(f"/v1/bulk/{job_id}/runs").json()["outcomes"]
        assert sorted(o["result"] for o in outcomes) == ["acted", "acted"]
        # Never two in flight: the second retry was created after the first had ended.
        assert retries[1]["created_at"] >= retries[0]["updated_at"]
