"""Agent versions on real workers: a run whose version no live worker serves waits (visibly, on
every surface, and uncounted by the sweeper) and finishes on that version once a worker serving it
starts; a v2 worker declared compatible with v1 takes v1 runs over once v1's workers are gone; a
handoff goes on at the target agent's version, in that version's queues.

Real processes throughout: a redis-server, worker processes of ``tests/agents_versions.py`` (their
version from the environment), a ``wesichain api`` process, and the CLI as a user runs it. The
SIGKILL cases (a drain, a migration) are in ``tests/chaos/test_versions.py``.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from producer.client import Client
from shared import protocol
from shared.events import VersionUpgraded, read_all_events
from shared.keys import Keys
from shared.state import Phase
from shared.tenants import Tenants
from shared.versions import waiting_reason
from tests.agents_versions import RAN_KEY
from tests.api_support import ApiProcess, bearer
from tests.broker import Settings, broker_env
from tests.harness import ROOT, RedisServer, WorkerProcess, start_all, wait_until
from worker.exporter import PoolCollector

AGENTS = "tests.agents_versions"
TIMEOUT_S = 60.0
#: The sweeper looks at a queued task after 0.5 s, then 1, 2, 4 s...: several looks in seconds.
FAST_SWEEPS = {"WESICHAIN_QUEUED_LEASE_S": "0.5", "WESICHAIN_LEASE_S": "2"}
WAITING = waiting_reason("deploy", "1")


@pytest.fixture
def server(store_factory: Callable[..., RedisServer]) -> RedisServer:
    """The test's own run-state Redis: its workers and their queues are seen by no other test."""
    return store_factory()


@pytest.fixture
def client(server: RedisServer) -> Iterator[Client]:
    c = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    yield c
    c.close()


def _worker(server: RedisServer, tmp_path: Path, name: str, version: str, **env: str) -> WorkerProcess:
    queues = env.pop("queues", None)
    return WorkerProcess(
        name,
        server.url,
        agents=AGENTS,
        pool="threads",
        concurrency=4,
        env={**FAST_SWEEPS, "AGENT_VERSION": version, **env},
        log_dir=str(tmp_path),
        queues=queues,
    )


def _cli(server: RedisServer, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "producer.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={
            "WESICHAIN_REDIS_URL": server.url,
            "WESICHAIN_AGENTS": AGENTS,
            "PATH": "/usr/bin:/bin",
            **broker_env(server.url),
        },
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _tenant_http(api: ApiProcess, server: RedisServer) -> httpx.Client:
    key, _ = Tenants(server.client(), Keys()).create_key(f"t-{uuid.uuid4().hex[:8]}", "test")
    return httpx.Client(base_url=api.url, headers=bearer(key), timeout=30)


def _event_kinds(client: Client, run_id: str) -> list[str]:
    return [e.kind for _, e in read_all_events(client.store, run_id)]


def test_a_run_whose_version_no_live_worker_serves_waits_visibly_and_finishes_on_that_version(
    server: RedisServer, client: Client, tmp_path: Path
) -> None:
    # v1's only worker serves its model phases, not its tools: the run's tool call, in v1's tools
    # queue, waits. Then that worker stops too, and v2 (which never serves v1) is all there is.
    v1_model = _worker(server, tmp_path, "v1-model", "1", queues="wesichain.model")
    v2 = _worker(server, tmp_path, "v2-a", "2")
    v1 = _worker(server, tmp_path, "v1-b", "1")
    api = ApiProcess(server.url, env={"WESICHAIN_AGENTS": AGENTS})
    r = server.client()
    try:
        start_all([v1_model])
        api.start()
        with _tenant_http(api, server) as owner, _tenant_http(api, server) as other:
            submitted = owner.post("/v1/runs", json={"agent": "deploy", "input": "old"})
            assert submitted.status_code == 202, submitted.text
            run_id = submitted.json()["run_id"]
            wait_until(
                lambda: (h := client.store.load(run_id)) is not None and h.phase is Phase.ACTING,
                TIMEOUT_S,
                what="the run to wait for its v1 tool call",
            )
            v1_model.stop()
            start_all([v2])
            # Several sweeps look at the waiting tool call and leave it queued: not handed on (its
            # epoch stays), not counted towards poison, not failed.
            wait_until(
                lambda: int(r.hget(client.store.keys.run(run_id), protocol.QUEUED_CHECKS) or 0) >= 3,
                TIMEOUT_S,
                what="three sweeps to look at the waiting run",
            )
            head = client.store.load(run_id)
            assert head is not None
            assert (head.phase, head.error, head.epoch, head.agent_version) == (Phase.ACTING, None, 0, "1")
            fields = [str(f) for f in r.hkeys(client.store.keys.run(run_id))]
            assert not any(f.startswith(protocol.LOST_PREFIX) for f in fields)

            # Every surface says what it waits for.
            assert client.handle(run_id).why_waiting() == WAITING
            view = owner.get(f"/v1/runs/{run_id}").json()
            assert (view["status"], view["waiting_for"]) == ("running", WAITING)
            listed = owner.get("/v1/runs").json()["runs"]
            assert [(v["run_id"], v["waiting_for"]) for v in listed] == [(run_id, WAITING)]
            assert f"waiting  {WAITING}" in _cli(server, "status", run_id).splitlines()
            assert any(
                line.startswith("deploy v1") and line.endswith(WAITING)
                for line in _cli(server, "workers", "versions").splitlines()
            )
            mine = owner.get("/v1/versions").json()["versions"]
            assert mine == [
                {
                    "agent": "deploy",
                    "version": "1",
                    "workers": 0,
                    "draining": 0,
                    "active_runs": 1,
                    "parked_runs": 0,
                    "waiting": True,
                },
                {
                    "agent": "deploy",
                    "version": "2",
                    "workers": 1,
                    "draining": 0,
                    "active_runs": 0,
                    "parked_runs": 0,
                    "waiting": False,
                },
                {
                    "agent": "desk",
                    "version": "1",
                    "workers": 1,
                    "draining": 0,
                    "active_runs": 0,
                    "parked_runs": 0,
                    "waiting": False,
                },
            ]
            # Another tenant sees neither the run nor that anyone's runs wait for deploy v1.
            theirs = other.get("/v1/versions").json()["versions"]
            assert [(v["agent"], v["version"], v["active_runs"]) for v in theirs] == [
                ("deploy", "2", 0),
                ("desk", "1", 0),
            ]
            stolen = other.get(f"/v1/runs/{run_id}")
            assert stolen.status_code == 404 and stolen.json()["error"]["kind"] == "not_found"
            assert other.get("/v1/runs").json()["runs"] == []
            families = {f.name: f for f in PoolCollector(client.store, client.settings).collect()}
            samples = families["wesichain_runs_waiting_for_version"].samples
            assert [(s.labels, s.value) for s in samples] == [({"agent": "deploy", "version": "1"}, 1.0)]

            start_all([v1])
            head = client.handle(run_id).wait(TIMEOUT_S)
            assert (head.phase, head.agent_version, head.answer) == (Phase.COMPLETED, "1", "answered by v1")
            assert r.lrange(RAN_KEY.format(run_id), 0, -1) == ["1"]
            assert not v2.received(run_id)
            assert owner.get(f"/v1/runs/{run_id}").json()["waiting_for"] is None
            families = {f.name: f for f in PoolCollector(client.store, client.settings).collect()}
            assert families["wesichain_runs_waiting_for_version"].samples == []
    finally:
        api.stop()
        for w in (v1_model, v2, v1):
            w.kill()
            w.stop()


def test_a_worker_compatible_with_v1_takes_parked_v1_runs_over_once_v1_is_gone(
    server: RedisServer, client: Client, tmp_path: Path
) -> None:
    v1 = _worker(server, tmp_path, "v1-a", "1", AGENT_APPROVE="1")
    v2 = _worker(server, tmp_path, "v2-a", "2", AGENT_APPROVE="1", AGENT_COMPATIBLE="1")
    r = server.client()
    try:
        start_all([v1])
        runs = [client.submit("deploy", f"old {i}").run_id for i in range(3)]
        wait_until(
            lambda: all(
                (h := client.store.load(i)) is not None and h.phase is Phase.AWAITING_APPROVAL for i in runs
            ),
            TIMEOUT_S,
            what="the v1 runs to park",
        )
        # Parked runs hold no worker: a drained v1 worker stops at once.
        client.drain(agent="deploy", version="1")
        wait_until(lambda: not v1.alive, TIMEOUT_S, what="the drained v1 worker to stop")
        start_all([v2])
        for run_id in runs:
            client.handle(run_id).approve()
        heads = {i: client.handle(i).wait(TIMEOUT_S) for i in runs}
    finally:
        for w in (v1, v2):
            w.kill()
            w.stop()
    for run_id, head in heads.items():
        assert (head.phase, head.agent_version, head.answer) == (Phase.COMPLETED, "2", "answered by v2"), (
            run_id
        )
        assert r.lrange(RAN_KEY.format(run_id), 0, -1) == ["2"]
        upgrades = [e for _, e in read_all_events(client.store, run_id) if isinstance(e, VersionUpgraded)]
        assert [(e.from_version, e.to_version, e.how) for e in upgrades] == [("1", "2", "compatible")]


def test_a_handoff_goes_on_in_the_target_agent_s_version_queues(
    server: RedisServer, client: Client, tmp_path: Path
) -> None:
    # desk v1 and deploy v2 on one worker; a deploy v1 worker consumes nothing but deploy v1's
    # version queues. The handed-off run is pinned to deploy v2: none of it reaches the v1 worker.
    both = _worker(server, tmp_path, "desk-v1", "2", DESK_VERSION="1")
    v1 = _worker(
        server, tmp_path, "deploy-v1", "1", queues="wesichain.model.deploy-v1,wesichain.tools.deploy-v1"
    )
    r = server.client()
    try:
        start_all([both, v1])
        handle = client.submit("desk", "ship it")
        head = handle.wait(TIMEOUT_S)
    finally:
        for w in (both, v1):
            w.kill()
            w.stop()
    assert (head.phase, head.answer) == (Phase.COMPLETED, "answered by v2"), head.error
    assert (head.agent, head.active_agent, head.agent_version) == ("desk", "deploy", "2")
    assert [(h.from_agent, h.to_agent, h.to_version) for h in head.handoffs] == [("desk", "deploy", "2")]
    assert r.lrange(RAN_KEY.format(handle.run_id), 0, -1) == ["2"]
    assert not v1.received(handle.run_id)
    started = [h for h in client.store.checkpoints(handle.run_id) if h.phase is not Phase.IDLE][0]
    assert (started.active_agent, started.agent_version) == ("desk", "1")
