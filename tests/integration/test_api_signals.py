"""Messages and updates sent into a running run over the HTTP API (a real uvicorn process, real
workers, a real redis-server): the answers, their one error shape, and the tenant boundary, tried
as an attacker would."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from producer.api_client import ApiClient, AsyncClient
from producer.client import RequestConflict
from shared.keys import Keys
from shared.signals import SignalView
from shared.tenants import Tenants
from tests.agents_fixture import HOLDING_KEY, RELEASE_KEY
from tests.api_support import ApiProcess, bearer, wait_status
from tests.harness import RedisServer, WorkerProcess, wait_until

TIMEOUT = 60


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, workers: list[WorkerProcess]) -> Iterator[ApiProcess]:
    process = ApiProcess(redis_server.url).start()
    yield process
    process.stop()


def _tenant(api: ApiProcess, redis_server: RedisServer) -> Iterator[httpx.Client]:
    key, _ = Tenants(redis_server.client(), Keys()).create_key(f"t-{uuid.uuid4().hex[:8]}", "test")
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as http:
        yield http


@pytest.fixture
def owner(api: ApiProcess, redis_server: RedisServer) -> Iterator[httpx.Client]:
    yield from _tenant(api, redis_server)


@pytest.fixture
def attacker(api: ApiProcess, redis_server: RedisServer) -> Iterator[httpx.Client]:
    yield from _tenant(api, redis_server)


def error_of(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"kind", "message", "details"}, body
    assert body["error"]["kind"] == kind, body
    error: dict[str, Any] = body["error"]
    return error


def _holding_run(http: httpx.Client, redis_server: RedisServer) -> str:
    response = http.post("/v1/runs", json={"agent": "inbox", "input": "go"})
    assert response.status_code == 202, response.text
    run_id: str = response.json()["run_id"]
    r = redis_server.client()
    wait_until(lambda: r.exists(HOLDING_KEY + run_id), TIMEOUT, what="the hold call to run")
    return run_id


def _release(redis_server: RedisServer, run_id: str) -> None:
    redis_server.client().set(RELEASE_KEY + run_id, "1", ex=3600)


def test_messages_and_updates_over_http(owner: httpx.Client, redis_server: RedisServer) -> None:
    run_id = _holding_run(owner, redis_server)
    sent = owner.post(
        f"/v1/runs/{run_id}/messages", json={"text": "hello"}, headers={"Idempotency-Key": "m1"}
    )
    assert sent.status_code == 202, sent.text
    assert sent.json() | {"at": 0} == {
        "run_id": run_id, "id": 1, "kind": "message", "status": "pending", "error": None,
        "version": None, "key": "m1", "duplicate": False, "at": 0,
    }  # fmt: skip
    again = owner.post(f"/v1/runs/{run_id}/messages", json={"text": "hello", "key": "m1"})
    assert again.status_code == 202 and again.json()["id"] == 1 and again.json()["duplicate"] is True
    error_of(
        owner.post(f"/v1/runs/{run_id}/messages", json={"text": "bye"}, headers={"Idempotency-Key": "m1"}),
        409,
        "conflict",
    )
    good = owner.post(f"/v1/runs/{run_id}/updates", json={"patch": {"priority": 3}}).json()
    bad = owner.post(f"/v1/runs/{run_id}/updates", json={"patch": {"priority": "high"}}).json()
    assert (good["id"], bad["id"]) == (2, 3)
    _release(redis_server, run_id)
    accepted = owner.get(f"/v1/runs/{run_id}/signals/2", params={"wait": 30}).json()
    rejected = owner.get(f"/v1/runs/{run_id}/signals/3", params={"wait": 30}).json()
    assert accepted["status"] == "accepted" and accepted["error"] is None
    assert rejected["status"] == "rejected" and "priority" in rejected["error"]
    run = wait_status(owner, run_id, {"completed"})
    assert run["state"] == {"priority": 3, "tags": []}
    assert run["answer"] == "heard: hello"
    # An ended run takes no signal: 409 run_ended; the key still answers its signal.
    error_of(owner.post(f"/v1/runs/{run_id}/messages", json={"text": "late"}), 409, "run_ended")
    assert (
        owner.post(f"/v1/runs/{run_id}/messages", json={"text": "hello", "key": "m1"}).json()["status"]
        == "accepted"
    )
    timeline = owner.get(f"/v1/runs/{run_id}/events", params={"follow": "false"})
    assert timeline.status_code == 200


def test_bad_and_forged_bodies_get_structured_errors(owner: httpx.Client, redis_server: RedisServer) -> None:
    run_id = _holding_run(owner, redis_server)
    url = f"/v1/runs/{run_id}"
    error_of(owner.post(f"{url}/messages", json={"text": "hi", "seq": 7}), 422, "invalid_request")
    error_of(owner.post(f"{url}/messages", json={"text": "hi", "kind": "update"}), 422, "invalid_request")
    error_of(owner.post(f"{url}/messages", json={"text": ""}), 422, "invalid_request")
    error_of(owner.post(f"{url}/messages", json={"text": "   "}), 422, "invalid_request")
    error_of(owner.post(f"{url}/messages", json={"text": 5}), 422, "invalid_request")
    error_of(
        owner.post(f"{url}/messages", content=b"{not json", headers={"content-type": "application/json"}),
        400,
        "bad_json",
    )
    error_of(owner.post(f"{url}/updates", json={"patch": []}), 422, "invalid_request")
    error_of(owner.post(f"{url}/updates", json={"patch": {}}), 422, "invalid_request")
    error_of(owner.post(f"{url}/updates", json={"patch": {"tags": ["x" * 70_000]}}), 422, "invalid_request")
    error_of(owner.post(f"{url}/messages", json={"text": "x" * 64_001}), 422, "invalid_request")
    error_of(
        owner.post(f"{url}/messages", json={"text": "hi", "key": "a"}, headers={"Idempotency-Key": "b"}),
        422,
        "invalid_request",
    )
    error_of(owner.get(f"{url}/signals/0"), 422, "invalid_request")
    error_of(owner.get(f"{url}/signals/1"), 404, "not_found")
    error_of(owner.get(f"{url}/signals/1", params={"wait": 31}), 422, "invalid_request")
    # Nothing of all that was stored; the run goes on.
    assert redis_server.client().exists(Keys().inbox(run_id)) == 0
    _release(redis_server, run_id)
    assert wait_status(owner, run_id, {"completed"})["answer"] == "heard: "


def test_another_tenants_run_is_not_found(
    owner: httpx.Client, attacker: httpx.Client, redis_server: RedisServer
) -> None:
    run_id = _holding_run(owner, redis_server)
    mine = owner.post(f"/v1/runs/{run_id}/messages", json={"text": "for the owner only", "key": "k"}).json()
    url = f"/v1/runs/{run_id}"
    missing = f"/v1/runs/{uuid.uuid4().hex}"
    for base in (url, missing):  # the same answer as for a run that does not exist
        error_of(attacker.post(f"{base}/messages", json={"text": "injected"}), 404, "not_found")
        error_of(
            attacker.post(f"{base}/messages", json={"text": "for the owner only", "key": "k"}),
            404,
            "not_found",
        )
        error_of(attacker.post(f"{base}/updates", json={"patch": {"priority": 9}}), 404, "not_found")
        error_of(attacker.get(f"{base}/signals/{mine['id']}"), 404, "not_found")
        error_of(attacker.get(f"{base}/signals/{mine['id']}", params={"wait": 1}), 404, "not_found")
    _release(redis_server, run_id)
    run = wait_status(owner, run_id, {"completed"})
    assert run["answer"] == "heard: for the owner only" and run["state"] == {"priority": 0, "tags": []}


def test_the_http_clients_send_and_wait(api: ApiProcess, redis_server: RedisServer) -> None:
    key, _ = Tenants(redis_server.client(), Keys()).create_key(f"c-{uuid.uuid4().hex[:8]}", "test")
    with ApiClient(api.url, key) as client:
        handle = client.submit("inbox", "go")
        run_id = handle.run_id
        wait_until(lambda: redis_server.client().exists(HOLDING_KEY + run_id), TIMEOUT, what="the hold call")
        sent = handle.send_message("from the sync client", key="s1")
        assert (sent.id, sent.status, handle.send_message("from the sync client", key="s1").duplicate) == (
            1,
            "pending",
            True,
        )
        with pytest.raises(RequestConflict, match="s1"):  # the HTTP clients raise what Client raises
            handle.send_message("other", key="s1")
        pending = handle.update({"priority": 4}, wait=None)
        assert pending.status == "pending"

        async def from_async() -> tuple[SignalView, SignalView]:
            async with AsyncClient(api.url, key) as aclient:
                ahandle = aclient.handle(run_id)
                await ahandle.send_message("from the async client")
                _release(redis_server, run_id)
                rejected = await ahandle.update({"priority": -1}, wait=TIMEOUT)
                return rejected, await ahandle.signal(pending.id, wait=TIMEOUT)

        rejected, accepted = asyncio.run(from_async())
        assert rejected.status == "rejected" and rejected.error is not None
        assert accepted.status == "accepted"
        head = handle.wait(TIMEOUT)
        assert head.answer == "heard: from the sync client | from the async client"
        assert head.state == {"priority": 4, "tags": []}
