"""The models a tenant's runs may name, over the HTTP API, as a hostile tenant would try them: on a
real uvicorn process, a real redis-server and real workers (scripted models that record who was
asked, and an OpenAI-compatible fake provider that records the model each request named).

A tenant allowed none runs its agents' models only: a ``model`` override, an assistant naming one,
a retry, fork or bulk retry of a run made with one are all refused (403 ``model_not_allowed``,
nothing started). An allowed tenant's run really calls the model it named. Taking a model back
applies to every new run: retries, forks, bulk jobs, runs of an assistant that names it and the
ticks of a schedule that runs one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from producer.api_client import ApiClient, ModelNotAllowed
from shared.keys import Keys
from shared.tenants import Tenants
from tests.agents_assistants import SEEN_KEY
from tests.api_support import ApiProcess, bearer, wait_status
from tests.conftest import own_store
from tests.fakeproviders import FakeProvider, Reply
from tests.harness import ROOT, RedisServer, WorkerProcess, wait_until
from tests.redis_cluster import RedisCluster
from tests.schedule_support import SchedulerProcess

TIMEOUT = 60
ENDED = {"completed", "failed", "interrupted", "cancelled"}
#: The scripted models the assistants' agent may be configured with (``tests/agents_assistants.py``).
OWN, OTHER = "scripted:concierge-a", "scripted:concierge-b"
#: The queue namespace of the worker serving the provider-backed agents.
PROVIDERS_NS = "providers"


@dataclass
class Tenant:
    name: str
    key: str
    http: httpx.Client


@pytest.fixture(scope="module")
def server(redis_cluster: RedisCluster | None) -> Iterator[RedisServer]:
    with own_store(redis_cluster) as s:
        yield s


@pytest.fixture(scope="module")
def openai() -> Iterator[FakeProvider]:
    with FakeProvider("openai", default=Reply(text="a fake answer")) as fake:
        yield fake


@pytest.fixture(scope="module")
def api(
    server: RedisServer, openai: FakeProvider, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiProcess]:
    log_dir = str(tmp_path_factory.mktemp("workers"))
    scripted = WorkerProcess(
        "models-scripted", server.url, agents="tests.agents_assistants", concurrency=2, log_dir=log_dir
    ).start()
    try:
        providers = WorkerProcess(
            "models-providers",
            server.url,
            agents="tests.agents_providers",
            concurrency=2,
            log_dir=log_dir,
            env=openai.env("sk-test-models"),
            namespaces=(PROVIDERS_NS,),  # its agents' own queues: the other worker's are not its
        ).start()
        try:
            process = ApiProcess(server.url).start()
            yield process
            process.stop()
        finally:
            providers.stop()
    finally:
        scripted.stop()


def _tenant(api: ApiProcess, server: RedisServer, *models: str) -> Iterator[Tenant]:
    """A new tenant allowed ``models`` (set before its first request: no API process has its
    settings cached yet)."""
    name = f"m-{uuid.uuid4().hex[:8]}"
    tenants = Tenants(server.client(), Keys())
    key, _ = tenants.create_key(name, "test")
    if models:
        tenants.set_models(name, models)
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
        yield Tenant(name, key, http)


@pytest.fixture
def bare(api: ApiProcess, server: RedisServer) -> Iterator[Tenant]:
    yield from _tenant(api, server)


@pytest.fixture
def allowed(api: ApiProcess, server: RedisServer) -> Iterator[Tenant]:
    yield from _tenant(api, server, OTHER)


def refused(response: httpx.Response, model: str, allowed: list[str]) -> None:
    """A 403 ``model_not_allowed`` naming ``model`` and the tenant's ``allowed`` ones."""
    assert response.status_code == 403, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"kind", "message", "details"}, body
    assert body["error"]["kind"] == "model_not_allowed", body
    assert body["error"]["details"] == {"model": model, "allowed": allowed}, body


def started(response: httpx.Response) -> str:
    assert response.status_code == 202, response.text
    run_id: str = response.json()["run_id"]
    return run_id


def runs_of(tenant: Tenant) -> set[str]:
    listed = tenant.http.get("/v1/runs", params={"limit": 200})
    assert listed.status_code == 200, listed.text
    return {r["run_id"] for r in listed.json()["runs"]}


def answer(tenant: Tenant, run_id: str) -> str:
    done = wait_status(tenant.http, run_id, ENDED, TIMEOUT)
    assert done["status"] == "completed", done["error"]
    text: str = done["answer"]
    return text


def seen_models(server: RedisServer, text: str) -> list[str]:
    """The scripted models asked about the input ``text``, in order."""
    raw = server.client().lrange(SEEN_KEY.format(text), 0, -1)
    return [json.loads(s)["model"] for s in raw]


def concierge(tenant: Tenant, text: str, **fields: Any) -> httpx.Response:
    body = {"agent": "concierge", "input": text, "metadata": {"hotel": "the Ritz"}, **fields}
    return tenant.http.post("/v1/runs", json=body)


def wait_applied(tenant: Tenant, model: str, allowed: bool) -> None:
    """Until the API processes see the tenant's allow-list as changed (they cache it a few
    seconds): asked for an agent nobody serves, a model allowed gets past the model check to a
    422 ``unknown_agent``, one refused a 403. Neither starts anything."""

    def applied() -> bool:
        probe = tenant.http.post("/v1/runs", json={"agent": "no-such-agent", "input": "x", "model": model})
        assert probe.status_code in (403, 422), probe.text
        return (probe.status_code == 422) == allowed

    wait_until(applied, 30, interval=0.2, what="the changed allow-list to apply")


HOSTILE = [
    OTHER,
    "scripted:*",  # a pattern-looking value is a model name, never a pattern
    "*:*",
    "scripted:Concierge-B",  # model names compare exactly
    "scripted:concierge-b:latest",
    "openai:gpt-4o",
]


def test_a_tenant_allowed_no_model_may_not_override_one_and_runs_its_agent_s(
    bare: Tenant, server: RedisServer
) -> None:
    for model in [*HOSTILE, "react+scripted:concierge-b"]:
        refused(concierge(bare, "override", model=model), model, [])
    assert runs_of(bare) == set()  # nothing started
    # Over-long: malformed before it is even compared.
    long = bare.http.post(
        "/v1/runs", json={"agent": "concierge", "input": "x", "model": "scripted:" + "b" * 300}
    )
    assert long.status_code == 422, long.text
    # Naming none, its runs use the agent's own model.
    text = f"plain {uuid.uuid4().hex[:6]}"
    plain = started(concierge(bare, text))
    assert answer(bare, plain) == "done by concierge-a"
    assert seen_models(server, text) == ["concierge-a", "concierge-a"]
    # Its retries and forks name no model either (the start filled in the agent's): all run.
    fork = started(bare.http.post(f"/v1/runs/{plain}/fork", json={}))
    assert answer(bare, fork) == "done by concierge-a"
    assert answer(bare, started(bare.http.post(f"/v1/runs/{plain}/retry"))) == "done by concierge-a"
    # A fork records the model its original ran with, to run it too; nobody named it, so a retry
    # or a fork of the fork keeps it as well.
    for again in (
        bare.http.post(f"/v1/runs/{fork}/retry"),
        bare.http.post(f"/v1/runs/{fork}/fork", json={}),
    ):
        assert answer(bare, started(again)) == "done by concierge-a"
    # The retry records the model as kept, not named: its own retries and forks keep it too.
    retried = started(bare.http.post(f"/v1/runs/{fork}/retry"))
    assert answer(bare, retried) == "done by concierge-a"
    twice = started(bare.http.post(f"/v1/runs/{retried}/retry"))
    assert answer(bare, twice) == "done by concierge-a"
    assert answer(bare, started(bare.http.post(f"/v1/runs/{twice}/fork", json={}))) == "done by concierge-a"
    # No producer can claim a model as kept: the field is the runtime's, not the request's.
    forged = bare.http.post(
        "/v1/runs", json={"agent": "concierge", "input": "x", "model": OTHER, "model_inherited": True}
    )
    assert forged.status_code == 422, forged.text


def test_an_allowed_tenant_s_run_calls_the_model_it_named_and_only_that_one(
    allowed: Tenant, server: RedisServer
) -> None:
    text = f"override {uuid.uuid4().hex[:6]}"
    run_id = started(concierge(allowed, text, model=OTHER))
    assert answer(allowed, run_id) == "done by concierge-b"
    assert seen_models(server, text) == ["concierge-b", "concierge-b"]
    for model in HOSTILE[1:]:
        refused(concierge(allowed, "override", model=model), model, [OTHER])
    assert runs_of(allowed) == {run_id}


def test_a_provider_pattern_allows_that_provider_s_models_as_the_workers_read_them(
    api: ApiProcess, server: RedisServer, openai: FakeProvider
) -> None:
    for tenant in _tenant(api, server, "openai:*"):
        Tenants(server.client(), Keys()).set_namespaces(tenant.name, [PROVIDERS_NS])
        before = len(openai.requests)
        # The provider's case and spaces are how a worker reads it: the same provider's model.
        run_id = started(
            tenant.http.post(
                "/v1/runs",
                json={
                    "agent": "openai_complete",
                    "input": "hi",
                    "model": " OpenAI:gpt-4o-mini",
                    "namespace": PROVIDERS_NS,
                },
            )
        )
        assert answer(tenant, run_id) == "a fake answer"
        asked = [r.body["model"] for r in openai.requests[before:] if isinstance(r.body, dict)]
        assert asked == ["gpt-4o-mini"]  # the model named, not the agent's fake-model
        for model in (OTHER, "anthropic:claude", "ollama:llama3"):
            refused(
                tenant.http.post("/v1/runs", json={"agent": "openai_complete", "input": "x", "model": model}),
                model,
                ["openai:*"],
            )


def test_the_python_client_raises_model_not_allowed(api: ApiProcess, bare: Tenant) -> None:
    with ApiClient(api.url, bare.key) as client, pytest.raises(ModelNotAllowed) as raised:
        client.submit("concierge", "x", model=OTHER)
    assert (raised.value.status, raised.value.details) == (403, {"model": OTHER, "allowed": []})


def test_the_cli_says_which_model_was_refused(api: ApiProcess, bare: Tenant) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "producer.cli", "submit", "concierge", "x", "--model", OTHER]
        + ["--api", api.url, "--key", bare.key],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 2, done
    assert f"ModelNotAllowed: 403 model_not_allowed: tenant {bare.name} may not name the model {OTHER!r}" in (
        done.stderr
    )


def test_an_assistant_may_name_only_a_model_its_tenant_is_allowed(bare: Tenant, allowed: Tenant) -> None:
    name = f"a-{uuid.uuid4().hex[:6]}"
    body = {"name": name, "agent": "concierge", "config": {"model": OTHER}}
    refused(bare.http.post("/v1/assistants", json=body), OTHER, [])
    assert bare.http.get(f"/v1/assistants/{name}").status_code == 404  # nothing made
    made = bare.http.post("/v1/assistants", json={**body, "config": {"max_steps": 5}})
    assert made.status_code == 201, made.text
    for model in HOSTILE:
        refused(bare.http.put(f"/v1/assistants/{name}", json={"config": {"model": model}}), model, [])
    assert bare.http.get(f"/v1/assistants/{name}").json()["version"] == 1
    # The allowed tenant's assistant runs with the model it names.
    assert allowed.http.post("/v1/assistants", json=body).status_code == 201
    text = f"assistant {uuid.uuid4().hex[:6]}"
    assert answer(allowed, started(concierge(allowed, text, assistant=name))) == "done by concierge-b"


def test_a_model_taken_back_refuses_every_new_run_that_would_use_it(
    allowed: Tenant, server: RedisServer
) -> None:
    thread = f"t-{uuid.uuid4().hex[:6]}"
    name = f"a-{uuid.uuid4().hex[:6]}"
    assert (
        allowed.http.post(
            "/v1/assistants", json={"name": name, "agent": "concierge", "config": {"model": OTHER}}
        ).status_code
        == 201
    )
    assert allowed.http.put(f"/v1/assistants/{name}", json={"config": {"max_steps": 5}}).status_code == 200
    first = started(concierge(allowed, "first", model=OTHER, thread_id=thread))
    assert answer(allowed, first) == "done by concierge-b"
    # A retry while the model is allowed runs with it again.
    retried = started(allowed.http.post(f"/v1/runs/{first}/retry"))
    assert answer(allowed, retried) == "done by concierge-b"
    before = runs_of(allowed)

    Tenants(server.client(), Keys()).set_models(allowed.name, [])
    wait_applied(allowed, OTHER, allowed=False)
    refused(allowed.http.post(f"/v1/runs/{first}/retry"), OTHER, [])
    refused(allowed.http.post(f"/v1/runs/{first}/fork", json={}), OTHER, [])
    # An assistant version made while allowed: its runs, and a rollback to it, are refused now.
    refused(concierge(allowed, "pinned", assistant=name, assistant_version=1), OTHER, [])
    refused(allowed.http.post(f"/v1/assistants/{name}/rollback", json={"version": 1}), OTHER, [])
    assert runs_of(allowed) == before  # nothing started
    # A bulk retry of the thread's runs records each refused, and starts nothing.
    job = allowed.http.post(
        "/v1/bulk", json={"action": "retry", "query": {"thread_id": thread}, "rate_per_s": 50}
    )
    assert job.status_code == 202, job.text
    job_id = job.json()["job_id"]
    wait_until(
        lambda: allowed.http.get(f"/v1/bulk/{job_id}").json()["status"] != "running", TIMEOUT, what="the job"
    )
    outcomes = allowed.http.get(f"/v1/bulk/{job_id}/runs").json()["outcomes"]
    assert {o["run_id"] for o in outcomes} == {first, retried}
    assert {o["result"] for o in outcomes} == {"failed"}
    assert all(o["reason"].startswith("ModelNotAllowed: ") and OTHER in o["reason"] for o in outcomes)
    assert runs_of(allowed) == before
    # Its current version names no model: its runs go on with the agent's.
    assert answer(allowed, started(concierge(allowed, "current", assistant=name))) == "done by concierge-a"


def test_a_schedule_s_ticks_use_its_assistant_s_model_only_while_it_is_allowed(
    allowed: Tenant, server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    name = f"a-{uuid.uuid4().hex[:6]}"
    made = allowed.http.post(
        "/v1/assistants", json={"name": name, "agent": "concierge", "config": {"model": OTHER}}
    )
    assert made.status_code == 201, made.text
    body = {
        "agent": "concierge",
        "assistant": name,
        "input": f"tick {uuid.uuid4().hex[:6]}",
        "metadata": {"hotel": "the Ritz"},
        "timing": {"every_s": 1},
        "overlap": "allow",
    }
    schedule = allowed.http.post("/v1/schedules", json=body)
    assert schedule.status_code == 201, schedule.text
    schedule_id = schedule.json()["schedule_id"]

    def ticks(outcome: str) -> list[dict[str, Any]]:
        listed = allowed.http.get(f"/v1/schedules/{schedule_id}/runs")
        assert listed.status_code == 200, listed.text
        return [t for t in listed.json()["runs"] if t["outcome"] == outcome]

    scheduler = SchedulerProcess(
        "models-scheduler", server.url, log_dir=str(tmp_path_factory.mktemp("s"))
    ).start()
    try:
        first = wait_until(lambda: ticks("started"), TIMEOUT, interval=0.2, what="a started tick")[0]
        assert answer(allowed, first["run_id"]) == "done by concierge-b"
        # The scheduler reads the allow-list when it fires a tick: the next ticks are refused.
        Tenants(server.client(), Keys()).set_models(allowed.name, [])
        failed = wait_until(lambda: ticks("failed"), TIMEOUT, interval=0.2, what="a refused tick")[0]
        assert failed["run_id"] is None
        assert failed["reason"] == f"tenant {allowed.name} may not name the model {OTHER!r}"
        # Nor may a new schedule run that assistant now (once the API processes see the change).
        wait_applied(allowed, OTHER, allowed=False)
        again = allowed.http.post("/v1/schedules", json={**body, "input": "again"})
        refused(again, OTHER, [])
    finally:
        assert allowed.http.post(f"/v1/schedules/{schedule_id}/pause").status_code == 200
        scheduler.stop()
