"""Thread policies through the HTTP API, as a tenant and as an attacker would use them: a real
``wesichain api``, real workers and a real redis-server.

``reject`` on a busy thread is a 409 ``thread_busy`` naming the busy run; thread ids are per
tenant, so another tenant naming the same thread id with ``reject``, ``interrupt`` or ``rollback``
neither finds it busy nor stops or rolls back the victim's run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared.keys import Keys
from shared.tenants import Tenants
from tests.agents_fixture import GATE_DIR_ENV
from tests.api_support import ApiProcess, bearer, wait_status
from tests.conftest import own_store
from tests.harness import RedisServer, WorkerProcess, wait_until
from tests.redis_cluster import RedisCluster

AGENTS = "tests.agents_fixture"
TIMEOUT = 60


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate")


@pytest.fixture(scope="module")
def redis_server(redis_cluster: RedisCluster | None) -> Iterator[RedisServer]:
    """This module's own run-state Redis: the session's shared workers, which have no gate, must
    not take the gated charge of these tests (only this module's gated worker serves it)."""
    with own_store(redis_cluster) as server:
        yield server


@pytest.fixture(scope="module")
def api(
    redis_server: RedisServer, gate: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiProcess]:
    log_dir = str(tmp_path_factory.mktemp("w"))
    worker = WorkerProcess(
        "tpa1", redis_server.url, agents=AGENTS, concurrency=3, log_dir=log_dir, env={GATE_DIR_ENV: str(gate)}
    ).start()
    process = ApiProcess(redis_server.url, env={"WESICHAIN_AGENTS": AGENTS}).start()
    yield process
    process.stop()
    worker.stop()


def _tenant(api: ApiProcess, server: RedisServer) -> Iterator[httpx.Client]:
    key, _ = Tenants(server.client(), Keys()).create_key(f"t-{uuid.uuid4().hex[:8]}", "test")
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
        yield http


@pytest.fixture
def victim(api: ApiProcess, redis_server: RedisServer) -> Iterator[httpx.Client]:
    yield from _tenant(api, redis_server)


@pytest.fixture
def attacker(api: ApiProcess, redis_server: RedisServer) -> Iterator[httpx.Client]:
    yield from _tenant(api, redis_server)


def _starts(gate: Path, run_id: str) -> int:
    path = gate / f"{run_id}:1:call_0.starts"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_reject_is_a_409_naming_the_busy_run_and_other_tenants_cannot_touch_the_thread(
    api: ApiProcess, victim: httpx.Client, attacker: httpx.Client, gate: Path, redis_server: RedisServer
) -> None:
    (gate / "open").unlink(missing_ok=True)
    thread = f"shared-name-{uuid.uuid4().hex[:6]}"
    made = victim.post("/v1/runs", json={"agent": "thread_charge", "input": "charge me", "thread_id": thread})
    assert made.status_code == 202, made.text
    busy_id = made.json()["run_id"]
    wait_until(lambda: _starts(gate, busy_id) == 1, TIMEOUT, what="the victim's charge to start")

    refused = victim.post(
        "/v1/runs", json={"agent": "echo", "input": "again?", "thread_id": thread, "thread_policy": "reject"}
    )
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["kind"] == "thread_busy"
    assert error["details"] == {"thread_id": thread, "run_id": busy_id, "retryable": True}
    assert busy_id in error["message"]

    bad = victim.post(
        "/v1/runs", json={"agent": "echo", "input": "x", "thread_id": thread, "thread_policy": "skip"}
    )
    assert bad.status_code == 422, bad.text

    # The attacker names the victim's thread id under every policy: its own thread, free each time.
    for policy in ("reject", "interrupt", "rollback", "enqueue"):
        mine = attacker.post(
            "/v1/runs", json={"agent": "echo", "input": policy, "thread_id": thread, "thread_policy": policy}
        )
        assert mine.status_code == 202, mine.text
        assert wait_status(attacker, mine.json()["run_id"], {"completed"}, TIMEOUT)["status"] == "completed"
    # Nor can it read, cancel or roll back the victim's run by its id.
    assert attacker.get(f"/v1/runs/{busy_id}").status_code == 404
    assert attacker.post(f"/v1/runs/{busy_id}/cancel").status_code == 404

    # The victim's run was not asked to stop: it is still in its charge, then completes.
    raw = redis_server.client().hget(Keys().run(busy_id), "cancel")
    assert raw is None
    assert victim.get(f"/v1/runs/{busy_id}").json()["status"] == "running"
    (gate / "open").touch()
    assert wait_status(victim, busy_id, {"completed"}, TIMEOUT)["status"] == "completed"
    after = victim.post(
        "/v1/runs", json={"agent": "echo", "input": "now?", "thread_id": thread, "thread_policy": "reject"}
    )
    assert after.status_code == 202, after.text


def test_a_tenant_whose_name_prefixes_anothers_cannot_reach_its_threads(
    api: ApiProcess, gate: Path, redis_server: RedisServer
) -> None:
    # Tenant names may hold ':', and so may thread ids: "org" with thread "eu:t1" and "org:eu" with
    # thread "t1" once named the same Redis keys, so either read, joined and stopped the other's.
    (gate / "open").unlink(missing_ok=True)
    org = f"t-{uuid.uuid4().hex[:8]}"
    tenants = Tenants(redis_server.client(), Keys())
    victim_key, _ = tenants.create_key(f"{org}:eu", "test")
    attacker_key, _ = tenants.create_key(org, "test")
    with (
        httpx.Client(base_url=api.url, headers=bearer(victim_key), timeout=30) as victim,
        httpx.Client(base_url=api.url, headers=bearer(attacker_key), timeout=30) as attacker,
    ):
        first = victim.post("/v1/runs", json={"agent": "echo", "input": "my secret", "thread_id": "t1"})
        assert wait_status(victim, first.json()["run_id"], {"completed"}, TIMEOUT)["status"] == "completed"
        busy = victim.post("/v1/runs", json={"agent": "thread_charge", "input": "charge", "thread_id": "t1"})
        busy_id = busy.json()["run_id"]
        wait_until(lambda: _starts(gate, busy_id) == 1, TIMEOUT, what="the victim's charge to start")

        for i, policy in enumerate(("reject", "interrupt", "rollback")):
            body = {"agent": "echo", "input": "hi", "thread_id": "eu:t1", "thread_policy": policy}
            mine = attacker.post("/v1/runs", json=body)
            assert mine.status_code == 202, mine.text  # not busy: the victim's thread is not its own
            done = wait_status(attacker, mine.json()["run_id"], {"completed"}, TIMEOUT)
            # Its own thread's history only: the system prompt, then each of its questions and answers.
            assert done["answer"] == f"seen 0 tool results in {2 + 2 * i} messages", done
        assert redis_server.client().hget(Keys().run(busy_id), "cancel") is None
        assert victim.get(f"/v1/runs/{busy_id}").json()["status"] == "running"
        (gate / "open").touch()
        assert wait_status(victim, busy_id, {"completed"}, TIMEOUT)["status"] == "completed"
        # The victim's thread goes on with its own runs only.
        after = victim.post("/v1/runs", json={"agent": "echo", "input": "again", "thread_id": "t1"})
        ended = wait_status(victim, after.json()["run_id"], {"completed"}, TIMEOUT)
        assert ended["answer"].startswith("seen 1 tool results"), ended
