"""Long-term memory on a real redis-server, a real worker and a real ``wesichain api``: what a tool
wrote in one thread a tool recalls in another; a middleware's write is made once; a tenant never
sees, reads, finds or deletes another's items (attacked through the HTTP API, and through runs);
the per-tenant quota; bad input refused with the API's error shape, nothing written."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from producer.api_client import ApiClient
from producer.client import Client
from shared.keys import Keys
from shared.memory import MAX_VALUE_BYTES, MemoryFull
from shared.tenants import TenantLimits, Tenants
from tests.agents_memory import PUTS_KEY
from tests.api_support import ApiProcess, bearer, wait_status
from tests.broker import Settings
from tests.conftest import own_store
from tests.harness import RedisServer, WorkerProcess, wait_until
from tests.redis_cluster import RedisCluster

AGENTS = "tests.agents_memory"
TIMEOUT = 60


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
def api(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiProcess]:
    worker = WorkerProcess(
        "mem1", server.url, agents=AGENTS, concurrency=2, log_dir=str(tmp_path_factory.mktemp("w"))
    ).start()
    process = ApiProcess(server.url, env={"WESICHAIN_AGENTS": AGENTS}).start()
    yield process
    process.stop()
    worker.stop()


@pytest.fixture
def client(server: RedisServer, api: ApiProcess) -> Iterator[Client]:
    c = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    yield c
    c.close()


def _tenant(api: ApiProcess, server: RedisServer) -> Iterator[Tenant]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    key, _ = Tenants(server.client(), Keys()).create_key(name, "test")
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
        yield Tenant(name, key, http)


@pytest.fixture
def victim(api: ApiProcess, server: RedisServer) -> Iterator[Tenant]:
    yield from _tenant(api, server)


@pytest.fixture
def attacker(api: ApiProcess, server: RedisServer) -> Iterator[Tenant]:
    yield from _tenant(api, server)


def _answer(tenant: Tenant, text: str, thread_id: str) -> str:
    started = tenant.http.post("/v1/runs", json={"agent": "keeper", "input": text, "thread_id": thread_id})
    assert started.status_code == 202, started.text
    view = wait_status(tenant.http, started.json()["run_id"], {"completed", "failed"}, TIMEOUT)
    assert view["status"] == "completed", view
    return str(view["answer"])


def _refused(response: httpx.Response, status: int, kind: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["kind"] == kind, response.text


def test_memory_a_tool_wrote_in_one_thread_is_recalled_in_another(victim: Tenant, client: Client) -> None:
    ns = f"n{uuid.uuid4().hex[:6]}"
    assert _answer(victim, f"remember {ns} drink likes green tea", "thread-a") == "remembered drink"
    assert _answer(victim, f"recall {ns} GREEN", "thread-b") == "likes green tea"
    assert _answer(victim, f"recall {ns} coffee", "thread-c") == "nothing"
    item = client.memory_for(victim.name).get(["user", ns], "drink")
    assert item is not None and item.version == 1 and item.value["text"] == "likes green tea"
    # Written once per recorded result: the tool put once, the store applied it once.
    run = client.list_runs(tenant=victim.name, thread_id="thread-a").runs[0]
    assert client.store.redis.hget(PUTS_KEY, f"{run.run_id}:1:call_0") == "1"
    # The same item through the HTTP API, as the tenant's client sees it.
    with ApiClient(str(victim.http.base_url), victim.key) as http_client:
        seen = http_client.memory.get(["user", ns], "drink")
        assert seen == item
        assert [i.key for i in http_client.memory.search(["user"], query="tea").items] == ["drink"]


def test_a_middleware_write_is_made_once(victim: Tenant, client: Client) -> None:
    ns = f"m{uuid.uuid4().hex[:6]}"
    assert _answer(victim, f"middleware {ns} k1", "thread-m") == "nothing to do"
    item = client.memory_for(victim.name).get(["user", ns], "k1")
    assert item is not None and item.value == {"seen": "k1"} and item.version == 1


def test_a_tenant_never_sees_another_tenants_items(victim: Tenant, attacker: Tenant) -> None:
    put = victim.http.put(
        "/v1/memory/items",
        json={"namespace": ["user", "secrets"], "key": "pin", "value": {"text": "1234 victim"}},
    )
    assert put.status_code == 200, put.text
    assert put.json()["version"] == 1
    where = {"namespace": ["user", "secrets"], "key": "pin"}
    # Read, search, list, delete: the attacker's tenant has no such item, and no namespaces.
    _refused(attacker.http.get("/v1/memory/items", params=where), 404, "not_found")
    found = attacker.http.post("/v1/memory/items/search", json={"namespace_prefix": [], "query": "victim"})
    assert found.status_code == 200 and found.json() == {"items": [], "truncated": False}
    listed = attacker.http.post("/v1/memory/namespaces", json={})
    assert listed.status_code == 200 and listed.json() == {"namespaces": []}
    gone = attacker.http.delete("/v1/memory/items", params=where)
    assert gone.status_code == 200 and gone.json() == {"deleted": False}
    # A body cannot name a tenant: an extra field is ignored, the caller's tenant is the key's.
    sneaky = attacker.http.post(
        "/v1/memory/items/search", json={"namespace_prefix": ["user"], "tenant": victim.name}
    )
    assert sneaky.status_code == 200 and sneaky.json()["items"] == []
    # Nor can the attacker's runs: its tools read its own tenant's memory.
    assert _answer(attacker, "recall secrets victim", "probe") == "nothing"
    # The victim's item is whole.
    mine = victim.http.get("/v1/memory/items", params=where)
    assert mine.status_code == 200 and mine.json()["value"] == {"text": "1234 victim"}
    assert mine.json()["version"] == 1
    assert victim.http.post("/v1/memory/namespaces", json={}).json() == {"namespaces": [["user", "secrets"]]}


def test_the_quota_and_bad_input(victim: Tenant, server: RedisServer) -> None:
    Tenants(server.client(), Keys()).set_limits(victim.name, TenantLimits(max_memory_items=2))
    for key in ("a", "b"):
        ok = victim.http.put("/v1/memory/items", json={"namespace": ["q"], "key": key, "value": {"n": 1}})
        assert ok.status_code == 200, ok.text
    full = victim.http.put("/v1/memory/items", json={"namespace": ["q"], "key": "c", "value": {"n": 1}})
    _refused(full, 409, "quota_exceeded")
    assert full.json()["error"]["details"] == {"max_memory_items": 2}
    # Replacing an item adds none: allowed at the quota.
    again = victim.http.put("/v1/memory/items", json={"namespace": ["q"], "key": "a", "value": {"n": 2}})
    assert again.status_code == 200 and again.json()["version"] == 2
    with ApiClient(str(victim.http.base_url), victim.key) as http_client, pytest.raises(MemoryFull):
        http_client.memory.put(["q"], "d", {"n": 1})
    # Bad input: the API's error shape, nothing written.
    for body in (
        {"namespace": ["bad/label"], "key": "k", "value": {}},
        {"namespace": [], "key": "k", "value": {}},
        {"namespace": ["q"], "key": "", "value": {}},
        {"namespace": ["q"], "key": "k", "value": [1, 2]},
        {"namespace": ["q"], "key": "k", "value": {"x": "y" * MAX_VALUE_BYTES}},
        {"namespace": ["q"], "key": "k\x00", "value": {}},
        {"namespace": ["q"], "key": "k", "value": {}, "ttl_s": -1},
    ):
        _refused(victim.http.put("/v1/memory/items", json=body), 422, "invalid_request")
    _refused(victim.http.post("/v1/memory/items/search", json={"limit": 1000}), 422, "invalid_request")
    keys = [i["key"] for i in victim.http.post("/v1/memory/items/search", json={}).json()["items"]]
    assert keys == ["a", "b"]


def test_expired_items_are_gone(client: Client) -> None:
    memory = client.memory_for(f"t-{uuid.uuid4().hex[:8]}")
    memory.put(["ttl"], "short", {"v": 1}, ttl_s=0.2)
    memory.put(["ttl"], "long", {"v": 2})
    wait_until(lambda: memory.get(["ttl"], "short") is None, 10, what="the short-lived item to expire")
    assert [i.key for i in memory.search(["ttl"]).items] == ["long"]
