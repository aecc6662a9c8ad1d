"""Handoffs over every surface, on real workers, a real redis-server and a real ``wesichain api``:
``/v1/agents`` (and the Python client, and ``wesichain agents``) lists each agent's handoff targets;
a fork of a handed-off run over HTTP goes on under the agent in charge at its checkpoint; another
tenant can neither fork the run nor learn anything of it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import httpx
import pytest

from producer.client import Client
from shared.keys import Keys
from shared.settings import Settings
from shared.tenants import Tenants
from tests.api_support import ApiProcess, bearer, wait_status
from tests.conftest import _need_redis
from tests.harness import RedisServer, WorkerProcess, running

AGENTS = "tests.agents_handoffs"
TIMEOUT = 60
TRIAGE_HANDOFFS = [
    {
        "agent": "billing",
        "tool": "transfer_to_billing",
        "description": "Hand the conversation over to the billing agent.",
        "filtered": False,
    },
    {
        "agent": "ghost",
        "tool": "transfer_to_ghost",
        "description": "Hand the conversation over to the ghost agent.",
        "filtered": False,
    },
    {
        "agent": "billing",
        "tool": "transfer_to_billing_filtered",
        "description": "Hand over to billing, without the tool calls so far.",
        "filtered": True,
    },
]


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    _need_redis()
    s = RedisServer().start()
    yield s
    s.cleanup()


@pytest.fixture(scope="module")
def pool(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    log_dir = str(tmp_path_factory.mktemp("handoff-api-workers"))
    with running(
        [WorkerProcess("ha1", server.url, agents=AGENTS, concurrency=2, log_dir=log_dir)]
    ) as started:
        yield started


@pytest.fixture(scope="module")
def api(server: RedisServer, pool: list[WorkerProcess]) -> Iterator[ApiProcess]:
    process = ApiProcess(server.url, env={"WESICHAIN_AGENTS": AGENTS}).start()
    yield process
    process.stop()


def _tenant(api: ApiProcess, server: RedisServer, name: str) -> httpx.Client:
    key, _ = Tenants(server.client(), Keys()).create_key(f"{name}-{uuid.uuid4().hex[:6]}", "test")
    return httpx.Client(base_url=api.url, headers=bearer(key), timeout=30)


def test_agents_list_their_handoff_targets(api: ApiProcess, server: RedisServer) -> None:
    with _tenant(api, server, "reader") as http:
        response = http.get("/v1/agents")
    assert response.status_code == 200, response.text
    agents = {a["name"]: a for a in response.json()["agents"]}
    assert agents["triage"]["handoffs"] == TRIAGE_HANDOFFS
    assert [h["agent"] for h in agents["billing"]["handoffs"]] == ["triage"]
    # The Python client reads the same from the registry.
    client = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    try:
        (triage,) = {
            a.name: a for w in client.workers.live() for a in w.record.agents if a.name == "triage"
        }.values()
    finally:
        client.close()
    assert [h.model_dump() for h in triage.handoffs] == TRIAGE_HANDOFFS
    # And the CLI's one line per agent names the targets once each.
    env = {**os.environ, "WESICHAIN_REDIS_URL": server.url, "WESICHAIN_AGENTS": AGENTS}
    out = subprocess.run(
        [sys.executable, "-m", "producer.cli", "agents"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("triage ")]
    assert "hands off to: billing, ghost" in line


def test_a_fork_over_http_goes_on_under_the_target_and_stays_with_its_tenant(
    api: ApiProcess, server: RedisServer
) -> None:
    with _tenant(api, server, "owner") as owner, _tenant(api, server, "other") as other:
        created = owner.post("/v1/runs", json={"agent": "triage", "input": "refund F-1"})
        assert created.status_code in (200, 201, 202), created.text
        run_id = created.json()["run_id"]
        run = wait_status(owner, run_id, {"completed", "failed"}, TIMEOUT)
        assert run["status"] == "completed" and run["current_agent"] == "billing", run
        checkpoints = owner.get(f"/v1/runs/{run_id}/checkpoints").json()["checkpoints"]
        after = next(c["version"] for c in checkpoints if c["phase"] == "thinking" and c["step"] == 2)
        # Another tenant: the same 404 as for a run that does not exist, and nothing forked.
        refused = other.post(f"/v1/runs/{run_id}/fork", json={"version": after})
        assert refused.status_code == 404, refused.text
        assert refused.json()["error"]["kind"] == "not_found" and "billing" not in refused.text
        forked = owner.post(f"/v1/runs/{run_id}/fork", json={"version": after})
        assert forked.status_code == 202, forked.text
        fork_id = forked.json()["run_id"]
        fork = wait_status(owner, fork_id, {"completed", "failed"}, TIMEOUT)
        assert fork["status"] == "completed", fork
        assert fork["agent"] == "triage" and fork["current_agent"] == "billing"
        assert fork["answer"] == "billing: refunded F-1"
        assert [(h["from_agent"], h["to_agent"], h["step"]) for h in fork["handoffs"]] == [
            ("triage", "billing", 1)
        ]
        assert other.get(f"/v1/runs/{fork_id}").status_code == 404
