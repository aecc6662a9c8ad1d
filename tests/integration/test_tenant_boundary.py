"""The tenant boundary of the runtime's own protocols, attacked through the public surface: a real
``wesichain api``, a real worker and a real redis-server.

A tenant tries to make its run count as another tenant's pipeline child (metadata that names the
pipeline, the pipeline's completion task as its callback), to send callback messages to queues and
tasks it was not given, to take another tenant's pipeline id, and to reuse an idempotency key for
another request. The links between a child run and what started it are the runtime's own fields
(``RunHead.link``), so none of that reaches the other tenant's bookkeeping.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import Celery

from producer.client import Client, idempotent_run_id
from shared.errors import InvalidRequest
from shared.keys import Keys
from shared.pipeline.store import child_run_id, stored_pipeline_id
from shared.request import check_run_id
from shared.tenants import Tenants
from tests.api_support import ApiProcess, bearer, wait_status
from tests.broker import Settings, broker_env, broker_for, queued
from tests.conftest import own_store
from tests.harness import ROOT, RedisServer, WorkerProcess, wait_until
from tests.redis_cluster import RedisCluster

AGENTS = "tests.agents_pipelines"
TIMEOUT = 60

#: Every metadata field the runtime's protocols once read, and the names of the fields of its links:
#: a producer may set any of them, and none may reach a pipeline's, an eval's or a parent's records.
PROTOCOL_METADATA = (
    "pipeline_id",
    "pipeline_step",
    "pipeline_item",
    "pipeline_attempt",
    "eval_id",
    "eval_item",
    "link",
    "parent",
    "kind",
    "seq",
    "item",
    "attempt",
    "run_id",
    "call_id",
    "depth",
)


@dataclass
class Tenant:
    name: str
    http: httpx.Client


@pytest.fixture(scope="module")
def server(redis_cluster: RedisCluster | None) -> Iterator[RedisServer]:
    with own_store(redis_cluster) as s:
        yield s


@pytest.fixture(scope="module")
def api(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiProcess]:
    # Slow items keep the victim's pipeline running while the attacker's runs come and go.
    worker = WorkerProcess(
        "tb1",
        server.url,
        agents=AGENTS,
        concurrency=3,
        log_dir=str(tmp_path_factory.mktemp("w")),
        env={"PIPE_SLOW_S": "1.5"},
    ).start()
    process = ApiProcess(server.url, env={"WESICHAIN_AGENTS": AGENTS}).start()
    yield process
    process.stop()
    worker.stop()


def _tenant(api: ApiProcess, server: RedisServer) -> Iterator[Tenant]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    key, _ = Tenants(server.client(), Keys()).create_key(name, "test")
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
        yield Tenant(name, http)


@pytest.fixture
def victim(api: ApiProcess, server: RedisServer) -> Iterator[Tenant]:
    yield from _tenant(api, server)


@pytest.fixture
def attacker(api: ApiProcess, server: RedisServer) -> Iterator[Tenant]:
    yield from _tenant(api, server)


def ended_pipeline(http: httpx.Client, pipeline_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body: dict[str, Any] = http.get(f"/v1/pipelines/{pipeline_id}").json()
        return body if body["status"] != "running" else None

    ended: dict[str, Any] = wait_until(done, TIMEOUT, interval=0.1, what=f"pipeline run {pipeline_id} to end")
    return ended


def refused(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    assert response.json()["error"]["kind"] == kind, response.text
    return str(response.json()["error"]["message"])


def keys_command(server: RedisServer, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "producer.cli", "keys", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={"WESICHAIN_REDIS_URL": server.url, "PATH": "/usr/bin:/bin", **broker_env(server.url)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_tenant_cannot_make_its_runs_another_tenants_pipeline_children(
    server: RedisServer, victim: Tenant, attacker: Tenant
) -> None:
    pid = f"victim-{uuid.uuid4().hex[:6]}"
    started = victim.http.post(
        "/v1/pipelines",
        json={"pipeline": "fan", "input": "slow a,slow b,slow c", "pipeline_id": pid},
    )
    assert started.status_code == 202, started.text
    # The attacker knows everything: the victim's tenant, its pipeline id, how ids are stored.
    stored = stored_pipeline_id(victim.name, pid)
    forged = {
        "pipeline_id": stored,
        "pipeline_step": 1,
        "pipeline_item": 0,
        "pipeline_attempt": 0,
        "eval_id": stored,
        "eval_item": "0:0:0",
    }
    # Naming the pipeline's own completion task (in any case) is refused before anything starts.
    for task in ("wesichain.pipeline.child", "WESICHAIN.Pipeline.Child", "wesichain.eval.score"):
        message = refused(
            attacker.http.post(
                "/v1/runs",
                json={"agent": "worker", "input": "x", "metadata": forged, "callback": {"task": task}},
            ),
            422,
            "invalid_request",
        )
        assert "reserved" in message
    assert attacker.http.get("/v1/runs").json()["runs"] == []
    # The same metadata without the callback is the attacker's own business: its runs end
    # (one completed, one cancelled), and the victim's pipeline never hears of them.
    done = attacker.http.post("/v1/runs", json={"agent": "worker", "input": "hijack", "metadata": forged})
    slow = attacker.http.post("/v1/runs", json={"agent": "worker", "input": "slow x", "metadata": forged})
    assert done.status_code == slow.status_code == 202
    assert attacker.http.post(f"/v1/runs/{slow.json()['run_id']}/cancel").status_code == 202
    wait_status(attacker.http, done.json()["run_id"], {"completed"}, TIMEOUT)
    wait_status(attacker.http, slow.json()["run_id"], {"interrupted"}, TIMEOUT)
    # A forged completion message, as a peer with broker access would send it, names the
    # attacker's run with the pipeline's metadata: the pool reads the stored run and ignores it.
    outsider = Celery("outsider", broker=broker_for(server.url) or server.url)
    try:
        for run_id, status in ((done.json()["run_id"], "completed"), (slow.json()["run_id"], "failed")):
            outsider.send_task(
                "wesichain.pipeline.child",
                args=[{"run_id": run_id, "status": status, "answer": "pwned", "metadata": forged}],
                queue="wesichain.model",
            )
            outsider.send_task(
                "wesichain.pipeline.child",
                args=[{"run_id": child_run_id(stored, 1, 0, 0), "status": "failed", "metadata": forged}],
                queue="wesichain.model",
            )
    finally:
        outsider.close()
    final = ended_pipeline(victim.http, pid)
    assert final["status"] == "completed", final
    assert final["output"] is not None and "pwned" not in json.dumps(final)
    assert "hijack" not in json.dumps(final) and "slow x" not in json.dumps(final)
    fan_out = final["steps"][1]
    assert [c["run_id"] for c in fan_out["children"]] == [child_run_id(stored, 1, i, 0) for i in range(3)]
    assert [c["status"] for c in fan_out["children"]] == ["completed"] * 3
    events = victim.http.get(f"/v1/pipelines/{pid}/events").json()["events"]
    named = {e.get("run_id") for e in events if e.get("run_id")}
    assert named.isdisjoint({done.json()["run_id"], slow.json()["run_id"]})


def test_every_reserved_task_and_protocol_field_is_refused_on_every_producer_path(
    server: RedisServer, attacker: Tenant
) -> None:
    from worker.app import create_app

    app = create_app(Settings(redis_url=server.url))
    # The pytest plugin of Celery registers test tasks in every app of this process: a worker's own
    # are its wesichain.* tasks (the runtime's phases and protocols).
    internal = sorted(name for name in app.tasks if name.startswith("wesichain."))
    assert {"wesichain.pipeline.child", "wesichain.eval.score", "wesichain.child_done"} <= set(internal)
    # Over HTTP: every task the workers register, and Celery's own, is refused as a callback.
    for task in [*internal, "celery.chord_unlock", "Celery.backend_cleanup"]:
        response = attacker.http.post(
            "/v1/runs", json={"agent": "worker", "input": "x", "callback": {"task": task}}
        )
        assert "reserved" in refused(response, 422, "invalid_request"), task
    # So are the runtime's link fields, as fields of the request.
    for field in ("link", "parent", "fork", "tenant", "run_id"):
        response = attacker.http.post(
            "/v1/runs", json={"agent": "worker", "input": "x", field: {"run_id": "r"}}
        )
        assert response.status_code == 422, (field, response.text)
    # Protocol names in the metadata are plain metadata: the run is created without any link.
    metadata = {name: "x" for name in PROTOCOL_METADATA}
    run = attacker.http.post("/v1/runs", json={"agent": "worker", "input": "x", "metadata": metadata})
    assert run.status_code == 202, run.text
    client = Client(Settings(redis_url=server.url))
    try:
        head = client.store.load(run.json()["run_id"])
        assert head is not None and head.link is None and head.parent is None and head.callback is None
        # The Python client and a bare start message refuse the same names.
        for task in internal:
            with pytest.raises(InvalidRequest, match="reserved"):
                client.submit("worker", "x", callback={"task": task}, check_agent=False)
        bare = f"bare-{uuid.uuid4().hex[:8]}"
        client.app.send_task(
            "wesichain.start",
            kwargs={
                "run_id": bare,
                "create": {"agent": "worker", "input": "x", "callback": {"task": "wesichain.pipeline.child"}},
            },
            queue="wesichain.model",
        )
        wait_until(lambda: client.store.load(bare), TIMEOUT, what="the bare start to create its run")
        failed = client.handle(bare).wait(TIMEOUT)
        assert failed.status == "failed" and failed.error is not None
        assert failed.error.kind == "InvalidRequest" and "reserved" in failed.error.message
        assert failed.callback is None and failed.link is None
    finally:
        client.close()


@pytest.mark.redis_broker  # reads the queues' lengths on kombu's Redis lists
def test_callback_tasks_and_queues_are_allow_listed_per_tenant(server: RedisServer, attacker: Tenant) -> None:
    http = attacker.http
    # The namespace is refused outright, and so is the same namespace's queue as a callback queue.
    refused(
        http.post("/v1/runs", json={"agent": "worker", "input": "x", "namespace": "nightly"}),
        403,
        "forbidden",
    )
    sneaky = {"task": "evil.task", "queue": "nightly.model"}
    refused(
        http.post("/v1/runs", json={"agent": "worker", "input": "x", "callback": sneaky}), 403, "forbidden"
    )
    # The pool's own queues, Celery's and kombu's are reserved, whatever the tenant is allowed, and
    # so is any name of the run state's keys (on the Redis broker a queue is a list of its name).
    for queue in ("wesichain.model", "wesichain.callbacks", "celery", "celeryev", "unacked", "_kombu.x"):
        response = http.post(
            "/v1/runs",
            json={"agent": "worker", "input": "x", "callback": {"task": "evil.task", "queue": queue}},
        )
        refused(response, 422, "invalid_request")
    # An operator allows one task and one queue: those, and only those, are accepted.
    own_queue = f"billing-{uuid.uuid4().hex[:6]}"
    out = keys_command(
        server,
        "celery-callbacks",
        "--tenant",
        attacker.name,
        "--allow-task",
        "billing.done",
        "--allow-queue",
        own_queue,
    )
    assert json.loads(out) == {"tasks": ["billing.done"], "queues": [own_queue]}

    def accepted() -> httpx.Response | None:  # an API process rereads a tenant's settings within 5 s
        response = http.post(
            "/v1/runs",
            json={"agent": "worker", "input": "x", "callback": {"task": "billing.done", "queue": own_queue}},
        )
        return response if response.status_code == 202 else None

    run = wait_until(accepted, TIMEOUT, interval=0.5, what="the allowance to apply").json()
    for callback in (
        {"task": "billing.done", "queue": "nightly.model"},
        {"task": "evil.task", "queue": own_queue},
    ):
        refused(
            http.post("/v1/runs", json={"agent": "worker", "input": "x", "callback": callback}),
            403,
            "forbidden",
        )
    wait_status(http, run["run_id"], {"completed"}, TIMEOUT)
    wait_until(lambda: queued(server.url, own_queue) == 1, TIMEOUT, what="the allowed callback to be sent")
    assert queued(server.url, "nightly.model") == 0
    # A reserved name cannot be allowed either.
    bad = subprocess.run(
        [sys.executable, "-m", "producer.cli", "keys", "celery-callbacks", "--tenant", attacker.name]
        + ["--allow-task", "wesichain.eval.score"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={"WESICHAIN_REDIS_URL": server.url, "PATH": "/usr/bin:/bin", **broker_env(server.url)},
    )
    assert bad.returncode == 2 and "reserved" in bad.stderr
    for queue, words in (
        (f"wesichain:tenant:{attacker.name}:keys", "holds ':'"),
        ("unacked", "reserved"),
        ("_kombu.binding.billing", "must be"),  # no name starts with _
    ):
        bad = subprocess.run(
            [sys.executable, "-m", "producer.cli", "keys", "celery-callbacks", "--tenant", attacker.name]
            + ["--allow-queue", queue],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            env={"WESICHAIN_REDIS_URL": server.url, "PATH": "/usr/bin:/bin", **broker_env(server.url)},
        )
        assert bad.returncode == 2 and words in bad.stderr, (queue, bad.stderr)


def test_pipeline_ids_are_per_tenant(victim: Tenant, attacker: Tenant) -> None:
    pid = f"nightly-{uuid.uuid4().hex[:6]}"
    # The attacker takes the id first (squatting), with another request: a slow one (each of its
    # two steps sleeps PIPE_SLOW_S), still running when it is cancelled below; a fast chain could
    # end first, and its cancel would rightly be a 409.
    squat = attacker.http.post(
        "/v1/pipelines", json={"pipeline": "chain", "input": "slow squat", "pipeline_id": pid}
    )
    assert squat.status_code == 202 and squat.json()["pipeline_id"] == pid
    mine = victim.http.post("/v1/pipelines", json={"pipeline": "chain", "input": "mine", "pipeline_id": pid})
    assert mine.status_code == 202, mine.text
    assert mine.json()["pipeline_id"] == pid and mine.json()["input"] == "mine"
    # Each reads, cancels and lists its own; neither learns of the other's.
    assert attacker.http.post(f"/v1/pipelines/{pid}/cancel").status_code == 202
    final = ended_pipeline(victim.http, pid)
    assert final["status"] == "completed" and final["input"] == "mine"
    assert ended_pipeline(attacker.http, pid)["status"] == "cancelled"
    assert [p["input"] for p in victim.http.get("/v1/pipelines").json()["pipelines"]] == ["mine"]
    # Another tenant's id it never used is a 404, as any missing one.
    other = f"never-{uuid.uuid4().hex[:6]}"
    assert (
        victim.http.post(
            "/v1/pipelines", json={"pipeline": "chain", "input": "a", "pipeline_id": other}
        ).status_code
        == 202
    )
    refused(attacker.http.get(f"/v1/pipelines/{other}"), 404, "not_found")
    refused(attacker.http.get(f"/v1/pipelines/{other}/events"), 404, "not_found")
    # The same id and request again is the same pipeline run; another request under it, a 409.
    again = victim.http.post("/v1/pipelines", json={"pipeline": "chain", "input": "mine", "pipeline_id": pid})
    assert again.status_code == 202 and again.json()["created_at"] == mine.json()["created_at"]
    refused(
        victim.http.post("/v1/pipelines", json={"pipeline": "chain", "input": "else", "pipeline_id": pid}),
        409,
        "conflict",
    )


def test_idempotency_compares_the_canonical_request(victim: Tenant, server: RedisServer) -> None:
    # Allowed before its first request (no API process has its settings cached yet).
    Tenants(server.client(), Keys()).set_models(victim.name, ["scripted:*"])
    http = victim.http
    metadata: dict[str, Any] = {"a": 1, "b": {"c": [1, 2], "d": "x"}}
    body: dict[str, Any] = {"agent": "worker", "input": "once", "metadata": metadata}
    reordered = {"metadata": {"b": {"d": "x", "c": [1, 2]}, "a": 1}, "input": "once", "agent": "worker"}
    key = {"Idempotency-Key": f"k-{uuid.uuid4().hex[:6]}"}
    first = http.post("/v1/runs", json=body, headers=key)
    assert first.status_code == 202, first.text
    # The same request with its object keys in another order is the same request.
    same = http.post("/v1/runs", json=reordered, headers=key)
    assert same.status_code == 202 and same.json()["run_id"] == first.json()["run_id"]
    # Another model, or 1.0 / true for 1, is another request: 409, before and after the run started.
    for changed in (
        {**body, "model": "scripted:other"},
        {**body, "metadata": {**metadata, "a": 1.0}},
        {**body, "metadata": {**metadata, "a": True}},
    ):
        refused(http.post("/v1/runs", json=changed, headers=key), 409, "conflict")
    wait_status(http, first.json()["run_id"], {"completed"}, TIMEOUT)
    for changed in ({**body, "model": "scripted:other"}, {**body, "input": "twice"}):
        refused(http.post("/v1/runs", json=changed, headers=key), 409, "conflict")
    after = http.post("/v1/runs", json=reordered, headers=key)
    assert after.status_code == 202 and after.json()["run_id"] == first.json()["run_id"]
    # With a model override, the same override is the same request after the start filled it in.
    modelled = {**body, "model": "scripted:worker"}
    key2 = {"Idempotency-Key": f"k-{uuid.uuid4().hex[:6]}"}
    run = http.post("/v1/runs", json=modelled, headers=key2).json()
    wait_status(http, run["run_id"], {"completed", "failed"}, TIMEOUT)
    assert http.post("/v1/runs", json=modelled, headers=key2).json()["run_id"] == run["run_id"]
    refused(http.post("/v1/runs", json=body, headers=key2), 409, "conflict")


def test_a_namespace_or_callback_taken_back_is_not_reused_by_retry_fork_or_bulk(
    server: RedisServer, attacker: Tenant, tmp_path: Path
) -> None:
    http, tenants = attacker.http, Tenants(server.client(), Keys())
    queue = f"billing-{uuid.uuid4().hex[:6]}"
    tenants.set_namespaces(attacker.name, ["nightly"])
    tenants.set_celery_callbacks(attacker.name, ["billing.done"], [queue])
    callback = {"task": "billing.done", "queue": queue}
    body = {"agent": "worker", "input": "x", "namespace": "nightly", "callback": callback}

    def accepted() -> httpx.Response | None:  # an API process rereads a tenant's settings within 5 s
        response = http.post("/v1/runs", json=body)
        return response if response.status_code == 202 else None

    nightly = WorkerProcess(
        "tb-nightly", server.url, agents=AGENTS, namespaces=("nightly",), log_dir=str(tmp_path)
    ).start()
    try:
        run_id = wait_until(accepted, TIMEOUT, interval=0.5, what="the allowances to apply").json()["run_id"]
        wait_status(http, run_id, {"completed"}, TIMEOUT)
        wait_until(lambda: queued(server.url, queue) == 1, TIMEOUT, what="its callback to be sent")
    finally:
        nightly.stop()
    tenants.set_namespaces(attacker.name, [])
    tenants.set_celery_callbacks(attacker.name, [], [])
    # A probe no worker could run: while the allowance holds it is a 422 (no such agent), not a run.
    probe = {**body, "agent": "no-such-agent"}
    revoked = lambda: http.post("/v1/runs", json=probe).status_code == 403  # noqa: E731
    wait_until(revoked, TIMEOUT, 0.5, what="the revocation")

    assert "namespace 'nightly'" in refused(http.post(f"/v1/runs/{run_id}/retry"), 403, "forbidden")
    assert "namespace 'nightly'" in refused(http.post(f"/v1/runs/{run_id}/fork", json={}), 403, "forbidden")
    # With the namespace allowed again but not the callback, a retry is still refused for it.
    tenants.set_namespaces(attacker.name, ["nightly"])
    wait_until(
        lambda: (
            http.post(f"/v1/runs/{run_id}/retry").status_code == 403
            and "billing.done" in http.post(f"/v1/runs/{run_id}/retry").text
        ),
        TIMEOUT,
        interval=0.5,
        what="the namespace to be allowed again",
    )
    tenants.set_namespaces(attacker.name, [])
    for action in ("retry", "fork"):
        job = http.post("/v1/bulk", json={"action": action, "query": {"agent": "worker"}, "rate_per_s": 50})
        assert job.status_code == 202, job.text
        job_id = job.json()["job_id"]

        def ended(job_id: str = job_id) -> bool:
            return bool(http.get(f"/v1/bulk/{job_id}").json()["status"] != "running")

        wait_until(ended, TIMEOUT, what="the job")
        outcomes = {o["run_id"]: o for o in http.get(f"/v1/bulk/{job_id}/runs").json()["outcomes"]}
        assert outcomes[run_id]["result"] == "failed", outcomes[run_id]
        assert outcomes[run_id]["reason"].startswith("NotAllowed: ")
    # Nothing was started from the old run, and no callback message was sent.
    listed = http.get("/v1/runs", params={"agent": "worker"}).json()["runs"]
    assert [r["run_id"] for r in listed] == [run_id]
    assert queued(server.url, queue) == 1  # the first run's own


def test_a_run_id_that_names_another_runs_keys_is_no_run(victim: Tenant, attacker: Tenant) -> None:
    """Run ids may hold ':', and a run's other keys are its key plus ':messages', ':inbox'...: the
    id 'X:messages' named run X's messages (in the same shard, 1 in 16), so asking for it answered
    500 where a run that does not exist answers 404: an oracle of another tenant's (idempotent,
    hence predictable) run ids. No run may have such an id, so it is a 404 like any other."""
    keys = Keys()
    for i in range(1000):
        key = f"order-{uuid.uuid4().hex}-{i}"
        run_id = idempotent_run_id(victim.name, key)
        if keys.shard(f"{run_id}:messages") == keys.shard(run_id):
            break
    made = victim.http.post(
        "/v1/runs", json={"agent": "worker", "input": "x"}, headers={"Idempotency-Key": key}
    )
    assert made.status_code == 202 and made.json()["run_id"] == run_id, made.text
    wait_status(victim.http, run_id, {"completed"}, TIMEOUT)
    for tail in (":messages", ":checkpoints", ":events", ":attempts", ":inbox", ":step:1:results"):
        for who in (attacker, victim):
            refused(who.http.get(f"/v1/runs/{run_id}{tail}"), 404, "not_found")
            refused(who.http.get(f"/v1/runs/{run_id}{tail}/events"), 404, "not_found")
    with pytest.raises(InvalidRequest, match="ends as a run's own keys do"):
        check_run_id(f"{run_id}:inbox")
