"""Assistants end to end on a real redis-server, a real worker and a real ``wesichain api``:
versions pinned to runs (asserted on what the scripted model received), rollback, diff, a field the
agent did not declare, the tool subset enforced, a tenant attacking another's assistants, and a
delete while a run pinned to the assistant is in its tool."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis

from shared.keys import Keys
from shared.tenants import TenantLimits, Tenants
from tests.agents_assistants import EFFECTS_KEY, HOLD_PIDS_KEY, RELEASE_KEY, SEEN_KEY
from tests.api_support import ApiProcess, bearer, wait_status
from tests.conftest import own_store
from tests.harness import RedisServer, WorkerProcess, wait_until
from tests.redis_cluster import RedisCluster

AGENTS = "tests.agents_assistants"
TIMEOUT = 60


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
    worker = WorkerProcess(
        "asst1", server.url, agents=AGENTS, concurrency=2, log_dir=str(tmp_path_factory.mktemp("w"))
    ).start()
    process = ApiProcess(server.url, env={"WESICHAIN_AGENTS": AGENTS}).start()
    yield process
    process.stop()
    worker.stop()


@pytest.fixture(scope="module")
def rds(server: RedisServer) -> Iterator[redis.Redis]:
    client = server.client()
    yield client
    client.close()


def _tenant(api: ApiProcess, server: RedisServer) -> Iterator[Tenant]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    tenants = Tenants(server.client(), Keys())
    key, _ = tenants.create_key(name, "test")
    tenants.set_models(name, ["scripted:*"])  # its assistants name the scripted models
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
        yield Tenant(name, http)


@pytest.fixture
def tenant(api: ApiProcess, server: RedisServer) -> Iterator[Tenant]:
    yield from _tenant(api, server)


@pytest.fixture
def attacker(api: ApiProcess, server: RedisServer) -> Iterator[Tenant]:
    yield from _tenant(api, server)


def ok(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    return body


def refused(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["kind"] == kind, response.text
    return error


def run(t: Tenant, text: str, **fields: Any) -> dict[str, Any]:
    started = ok(t.http.post("/v1/runs", json={"agent": "concierge", "input": text, **fields}), 202)
    return wait_status(t.http, started["run_id"], {"completed", "failed"}, TIMEOUT)


def set_fields(config: dict[str, Any]) -> dict[str, Any]:
    """A configuration as shown, without the fields it leaves to the agent (null)."""
    return {k: v for k, v in config.items() if v is not None}


def seen(rds: redis.Redis, text: str) -> list[dict[str, Any]]:
    return [json.loads(s) for s in rds.lrange(SEEN_KEY.format(text), 0, -1)]


V1 = {"model": "scripted:concierge-a", "template_values": {"hotel": "the Ritz"}, "tools": ["lookup"]}
V2 = {
    "model": "scripted:concierge-b",
    "system_prompt": "You are the night porter.",
    "tools": ["lookup", "book"],
}


def test_runs_keep_the_version_they_were_created_with(tenant: Tenant, rds: redis.Redis) -> None:
    name = f"ritz-{uuid.uuid4().hex[:6]}"
    created = ok(
        tenant.http.post("/v1/assistants", json={"name": name, "agent": "concierge", "config": V1}), 201
    )
    assert (created["version"], created["agent"]) == (1, "concierge")
    first = run(tenant, f"first {name}", assistant=name)
    assert (first["status"], first["assistant"], first["assistant_version"]) == ("completed", name, 1)
    updated = ok(tenant.http.put(f"/v1/assistants/{name}", json={"config": V2, "if_version": 1}), 200)
    assert updated["version"] == 2
    second = run(tenant, f"second {name}", assistant=name)
    assert (second["status"], second["assistant_version"], second["model"]) == (
        "completed",
        2,
        "scripted:concierge-b",
    )
    assert second["answer"] == "done by concierge-b"

    # What each model call received: v1's filled template, model and subset; then v2's.
    for call in seen(rds, f"first {name}"):
        assert (call["model"], call["system"], call["tools"]) == (
            "concierge-a",
            "You help the guests of the Ritz.",
            ["lookup"],
        )
    for call in seen(rds, f"second {name}"):
        assert (call["model"], call["system"], call["tools"]) == (
            "concierge-b",
            "You are the night porter.",
            ["lookup", "book"],
        )
    assert len(seen(rds, f"first {name}")) == 2 and len(seen(rds, f"second {name}")) == 2
    # The first run's record is still v1.
    assert ok(tenant.http.get(f"/v1/runs/{first['run_id']}"), 200)["assistant_version"] == 1

    diff = ok(tenant.http.get(f"/v1/assistants/{name}/diff", params={"from": 1, "to": 2}), 200)
    assert [(c["field"], c["change"]) for c in diff["changes"]] == [
        ("model", "changed"),
        ("system_prompt", "added"),
        ("template_values.hotel", "removed"),
        ("tools", "changed"),
    ]
    stale = refused(
        tenant.http.put(f"/v1/assistants/{name}", json={"config": V1, "if_version": 1}), 409, "conflict"
    )
    assert "version 2" in stale["message"]

    back = ok(tenant.http.post(f"/v1/assistants/{name}/rollback", json={"version": 1}), 201)
    assert (back["version"], back["restored_from"], set_fields(back["config"])) == (3, 1, V1)
    assert (
        ok(tenant.http.get(f"/v1/assistants/{name}/diff", params={"from": 1, "to": 3}), 200)["changes"] == []
    )
    third = run(tenant, f"third {name}", assistant=name)
    assert third["assistant_version"] == 3 and third["answer"] == "done by concierge-a"
    assert {c["system"] for c in seen(rds, f"third {name}")} == {"You help the guests of the Ritz."}
    pinned = run(tenant, f"pinned {name}", assistant=name, assistant_version=2)
    assert pinned["assistant_version"] == 2 and pinned["answer"] == "done by concierge-b"

    versions = ok(tenant.http.get(f"/v1/assistants/{name}/versions"), 200)
    assert [v["version"] for v in versions["versions"]] == [3, 2, 1] and versions["next_before"] is None
    listed = ok(tenant.http.get("/v1/assistants"), 200)["assistants"]
    assert [(a["name"], a["version"]) for a in listed] == [(name, 3)]
    assert (
        set_fields(ok(tenant.http.get(f"/v1/assistants/{name}", params={"version": 2}), 200)["config"]) == V2
    )


def test_a_field_the_agent_did_not_declare_is_refused(tenant: Tenant) -> None:
    def create(agent: str, config: dict[str, Any]) -> httpx.Response:
        return tenant.http.post(
            "/v1/assistants", json={"name": f"x-{uuid.uuid4().hex[:6]}", "agent": agent, "config": config}
        )

    assert refused(create("plain", {"max_steps": 3}), 422, "invalid_request")["details"] == {"field": "agent"}
    for config, field in (
        ({"tools": ["lookup", "shell"]}, "tools"),
        ({"max_steps": 50}, "max_steps"),
        ({"template_values": {"secret": "x"}}, "template_values"),
        ({"policy": {"on_truncated": "fail"}}, "policy"),
    ):
        error = refused(create("concierge", config), 422, "invalid_request")
        assert error["details"] == {"field": field}, error
    unknown = refused(create("concierge", {"temperature": 0.1}), 422, "invalid_request")
    assert "config.temperature" in unknown["message"]
    refused(create("nobody", {}), 422, "unknown_agent")
    assert ok(tenant.http.get("/v1/assistants"), 200)["assistants"] == []  # nothing half-written


def test_a_call_of_a_tool_outside_the_subset_is_refused(tenant: Tenant, rds: redis.Redis) -> None:
    name = f"look-{uuid.uuid4().hex[:6]}"
    ok(tenant.http.post("/v1/assistants", json={"name": name, "agent": "concierge", "config": V1}), 201)
    ended = run(tenant, f"forge {name}", assistant=name)
    assert ended["status"] == "failed"
    assert ended["error"]["kind"] == "InvalidModelAction" and ended["error"]["tool"] == "book"
    assert rds.hget(EFFECTS_KEY, ended["run_id"]) is None
    assert [c["tools"] for c in seen(rds, f"forge {name}")] == [["lookup"]]


def test_a_tenant_cannot_reach_another_tenants_assistant(
    tenant: Tenant, attacker: Tenant, rds: redis.Redis
) -> None:
    name = f"mine-{uuid.uuid4().hex[:6]}"
    ok(tenant.http.post("/v1/assistants", json={"name": name, "agent": "concierge", "config": V1}), 201)
    for response in (
        attacker.http.get(f"/v1/assistants/{name}"),
        attacker.http.delete(f"/v1/assistants/{name}"),
        attacker.http.get(f"/v1/assistants/{name}", params={"version": 1}),
        attacker.http.get(f"/v1/assistants/{name}/versions"),
        attacker.http.get(f"/v1/assistants/{name}/diff", params={"from": 1, "to": 1}),
        attacker.http.put(f"/v1/assistants/{name}", json={"config": V2}),
        attacker.http.post(f"/v1/assistants/{name}/rollback", json={"version": 1}),
    ):
        refused(response, 404, "not_found")
    assert ok(attacker.http.get("/v1/assistants"), 200)["assistants"] == []
    refused(
        attacker.http.post(
            "/v1/runs", json={"agent": "concierge", "input": f"steal {name}", "assistant": name}
        ),
        422,
        "invalid_request",
    )
    # Its own assistant of the same name is its own, and changes nothing of the victim's.
    ok(attacker.http.post("/v1/assistants", json={"name": name, "agent": "concierge", "config": V2}), 201)
    ok(attacker.http.put(f"/v1/assistants/{name}", json={"config": V2}), 200)
    victim = ok(tenant.http.get(f"/v1/assistants/{name}"), 200)
    assert (victim["version"], set_fields(victim["config"])) == (1, V1)
    assert run(tenant, f"own {name}", assistant=name)["answer"] == "done by concierge-a"
    # Malformed names never reach Redis.
    refused(attacker.http.get("/v1/assistants/has:colon"), 422, "invalid_request")


def test_a_deleted_assistant_takes_no_new_run_and_its_pinned_run_goes_on(
    tenant: Tenant, rds: redis.Redis
) -> None:
    name = f"gone-{uuid.uuid4().hex[:6]}"
    config = {**V1, "tools": ["hold", "lookup"]}
    ok(tenant.http.post("/v1/assistants", json={"name": name, "agent": "concierge", "config": config}), 201)
    ok(tenant.http.put(f"/v1/assistants/{name}", json={"config": config}), 200)
    started = ok(
        tenant.http.post("/v1/runs", json={"agent": "concierge", "input": f"hold {name}", "assistant": name}),
        202,
    )
    run_id = started["run_id"]
    wait_until(lambda: rds.hget(HOLD_PIDS_KEY, run_id), TIMEOUT, what="the run to be in its tool")

    deleted = tenant.http.delete(f"/v1/assistants/{name}")
    assert (deleted.status_code, deleted.content) == (204, b"")
    for response in (
        tenant.http.get(f"/v1/assistants/{name}"),
        tenant.http.get(f"/v1/assistants/{name}", params={"version": 1}),
        tenant.http.get(f"/v1/assistants/{name}/versions"),
        tenant.http.put(f"/v1/assistants/{name}", json={"config": V2}),
        tenant.http.delete(f"/v1/assistants/{name}"),
    ):
        refused(response, 404, "not_found")
    assert name not in [a["name"] for a in ok(tenant.http.get("/v1/assistants"), 200)["assistants"]]
    refused(
        tenant.http.post("/v1/runs", json={"agent": "concierge", "input": f"new {name}", "assistant": name}),
        422,
        "invalid_request",
    )

    # The run pinned to version 2 before the delete finishes with it.
    rds.set(RELEASE_KEY.format(run_id), "1", ex=600)
    ended = wait_status(tenant.http, run_id, {"completed", "failed"}, TIMEOUT)
    assert (ended["status"], ended["assistant_version"], ended["answer"]) == (
        "completed",
        2,
        "done by concierge-a",
    )

    # Created again, the name continues its numbering: version 2 still means what it meant.
    again = ok(
        tenant.http.post("/v1/assistants", json={"name": name, "agent": "concierge", "config": V2}), 201
    )
    assert again["version"] == 3
    assert set_fields(
        ok(tenant.http.get(f"/v1/assistants/{name}", params={"version": 2}), 200)["config"]
    ) == (config)


def test_a_tenant_churning_assistant_names_stays_within_its_byte_quota(
    tenant: Tenant, attacker: Tenant, server: RedisServer
) -> None:
    """Creating, filling and deleting names again and again (each delete keeps the versions for
    the runs' retention) must not let a tenant hold more than its quota; another tenant is not
    touched by it."""
    Tenants(server.client(), Keys()).set_limits(attacker.name, TenantLimits(max_assistant_bytes=60_000))
    big = {"system_prompt": "x" * 9_000}
    held = 0
    for i in range(20):
        name = f"churn-{i}"
        answer = attacker.http.post(
            "/v1/assistants", json={"name": name, "agent": "concierge", "config": big}
        )
        if answer.status_code == 409:
            error = refused(answer, 409, "quota_exceeded")
            break
        ok(answer, 201)
        ok(attacker.http.put(f"/v1/assistants/{name}", json={"config": big}), 200)
        assert attacker.http.delete(f"/v1/assistants/{name}").status_code == 204
        held += 2
    else:
        raise AssertionError("20 names of 2 versions of 9 KB each fitted in a 60 KB quota")
    assert held == 6  # three names' two versions each: 54 KB of 60 KB, and the seventh does not fit
    details = error["details"]
    assert details["max_assistant_bytes"] == 60_000 and 54_000 < details["held_bytes"] <= 60_000
    assert details["frees_at"] > time.time()  # when the first deleted name's versions expire
    # Nothing of the refused name was written.
    refused(attacker.http.get("/v1/assistants/churn-3"), 404, "not_found")
    # The tenant beside it is not held back.
    ok(
        tenant.http.post("/v1/assistants", json={"name": "neighbour", "agent": "concierge", "config": big}),
        201,
    )
