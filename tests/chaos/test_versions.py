"""Deploying new agent code: runs started on v1 finish on v1, new runs start on v2, none fails and
none mixes, while v1's workers drain and stop, and when one of them is SIGKILLed mid-drain.

Real processes throughout: a redis-server, two v1 workers and two v2 workers of the same agents
module (``tests/agents_versions.py``, its version from the environment), whose tool records the
version of the code that ran it and whose answer says it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from producer.client import Client
from shared.events import VersionUpgraded, read_all_events
from shared.state import Phase
from tests.agents_versions import MIGRATED_KEY, RAN_KEY
from tests.broker import Settings
from tests.chaos.support import CHAOS_ENV, pause_pid, wait_paused
from tests.harness import RedisServer, WorkerProcess, start_all, wait_until

AGENTS = "tests.agents_versions"
LEASES = {k: v for k, v in CHAOS_ENV.items() if k.endswith("LEASE_S")}
OLD_RUNS = 6
NEW_RUNS = 6
TIMEOUT_S = 60.0


@pytest.fixture
def client(server: RedisServer) -> Iterator[Client]:
    c = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    yield c
    c.close()


def _workers(
    server: RedisServer,
    tmp_path: Path,
    version: str,
    names: tuple[str, ...],
    queues: str | None = None,
    **env: str,
) -> list[WorkerProcess]:
    return [
        WorkerProcess(
            name,
            server.url,
            agents=AGENTS,
            pool="threads",
            concurrency=4,
            env={**LEASES, "AGENT_VERSION": version, **env},
            log_dir=str(tmp_path),
            queues=queues,
        )
        for name in names
    ]


def _draining_and_off_the_default_queues(client: Client, workers: list[WorkerProcess]) -> bool:
    """Every one of ``workers`` drains, consuming only its version queues; or it has drained
    already and stopped (its runs may all have ended before the drain was asked: then it stops
    within one registry beat, and its record is gone before anyone reads it draining)."""
    records = {w.record.id: w.record for w in client.workers.live()}

    def draining(w: WorkerProcess) -> bool:
        record = records.get(f"{w.name}@test")
        if record is not None:
            return record.draining and all(q.count(".") == 2 for q in record.queues)
        return not w.alive and " drained (" in w.log()

    return all(draining(w) for w in workers)


@pytest.mark.parametrize("kill", [False, True], ids=["drain", "sigkill-mid-drain"])
def test_a_deploy_finishes_v1_runs_on_v1_and_starts_new_runs_on_v2(
    server: RedisServer, client: Client, tmp_path: Path, kill: bool
) -> None:
    fault = {**CHAOS_ENV, "WESICHAIN_FAULT": "pause:thinking"} if kill else {}
    v1a = _workers(server, tmp_path, "1", ("v1-a",), **fault)[0]
    v1b = _workers(server, tmp_path, "1", ("v1-b",))[0]
    v2 = _workers(server, tmp_path, "2", ("v2-a", "v2-b"))
    everyone = [v1a, v1b, *v2]
    r = server.client()
    try:
        start_all([v1a, v1b])
        old = [client.submit("deploy", f"old {i}").run_id for i in range(OLD_RUNS)]
        # Every old run is pinned to v1 (its start committed) before v2 is deployed.
        wait_until(
            lambda: all((h := client.store.load(i)) is not None and h.agent_version == "1" for i in old),
            TIMEOUT_S,
            what="the old runs to start on v1",
        )
        victims: list[str] = []
        if kill:
            # v1-a pauses in every think it takes: those runs are in flight on it when it dies.
            victims = wait_until(
                lambda: [i for i in old if pause_pid(r, Phase.THINKING, i)] or None,
                TIMEOUT_S,
                what="a run paused in v1-a's think",
            )
        start_all(v2)
        client.drain(agent="deploy", version="1")
        wait_until(
            lambda: _draining_and_off_the_default_queues(client, [v1a, v1b]), TIMEOUT_S, what="v1 draining"
        )
        new = [client.submit("deploy", f"new {i}").run_id for i in range(NEW_RUNS)]
        if kill:
            wait_paused(r, Phase.THINKING, victims[0], timeout=TIMEOUT_S)
            v1a.kill()
        heads = {i: client.handle(i).wait(timeout=TIMEOUT_S) for i in old + new}
        # The drained v1 workers stop by themselves once no v1 run is left.
        wait_until(lambda: not v1b.alive and (kill or not v1a.alive), TIMEOUT_S, what="v1 workers to stop")
    finally:
        for w in everyone:
            w.kill()
            w.stop()
    for run_id, head in heads.items():
        assert head.phase is Phase.COMPLETED, (run_id, head.error)
    for run_id in old:
        assert heads[run_id].agent_version == "1"
        assert heads[run_id].answer == "answered by v1"
        assert r.lrange(RAN_KEY.format(run_id), 0, -1) == ["1"]
    for run_id in new:
        assert heads[run_id].agent_version == "2"
        assert heads[run_id].answer == "answered by v2"
        assert r.lrange(RAN_KEY.format(run_id), 0, -1) == ["2"]
    for run_id in old:
        assert not any(w.received(run_id) for w in v2), run_id
    if kill:
        # The killed worker's think was taken over by the other v1 worker, never by v2.
        victim = victims[0]
        assert v1a.received(victim) and v1b.received(victim)


@pytest.mark.parametrize("kill", [False, True], ids=["migrate", "sigkill-mid-migration"])
def test_a_migration_to_v2_is_committed_once_by_the_worker_that_commits_the_phase(
    server: RedisServer, client: Client, tmp_path: Path, kill: bool
) -> None:
    # v1's model worker takes the runs to their tool calls and stops; v1's tool worker runs them;
    # their observe (a model phase) is v2's, which migrates from v1. With ``kill``, the first v2
    # worker migrates each run's state, pauses in the phase and is SIGKILLed there: the other v2
    # worker takes the phase over, migrates afresh and commits; the migration is committed once.
    v1_model = _workers(server, tmp_path, "1", ("v1-model",), queues="wesichain.model")[0]
    v1_tools = _workers(server, tmp_path, "1", ("v1-tools",), queues="wesichain.tools")[0]
    fault = {**CHAOS_ENV, "WESICHAIN_FAULT": "pause:observing"} if kill else {}
    v2a = _workers(server, tmp_path, "2", ("v2-a",), AGENT_MIGRATE_FROM="1", **fault)[0]
    v2b = _workers(server, tmp_path, "2", ("v2-b",), AGENT_MIGRATE_FROM="1")[0]
    r = server.client()
    try:
        start_all([v1_model])
        runs = [client.submit("deploy", f"old {i}").run_id for i in range(3)]
        wait_until(
            lambda: all((h := client.store.load(i)) is not None and h.phase is Phase.ACTING for i in runs),
            TIMEOUT_S,
            what="the v1 runs to wait for their tool calls",
        )
        v1_model.stop()
        start_all([v2a, v1_tools])
        if kill:
            for run_id in runs:
                wait_paused(r, Phase.OBSERVING, run_id, timeout=TIMEOUT_S)
            start_all([v2b])
            v2a.kill()
        heads = {i: client.handle(i).wait(timeout=TIMEOUT_S) for i in runs}
    finally:
        for w in (v1_model, v1_tools, v2a, v2b):
            w.kill()
            w.stop()
    committer = v2b if kill else v2a
    for run_id, head in heads.items():
        assert (head.phase, head.agent_version, head.answer) == (Phase.COMPLETED, "2", "answered by v2"), (
            run_id
        )
        assert head.state == {"migrated_from": "1"}
        # The tool call of v1's step ran on v1's code; the upgrade came at the step's boundary.
        assert r.lrange(RAN_KEY.format(run_id), 0, -1) == ["1"]
        upgrades = [e for _, e in read_all_events(client.store, run_id) if isinstance(e, VersionUpgraded)]
        assert [(e.from_version, e.to_version, e.how) for e in upgrades] == [("1", "2", "migrated")]
        # The checkpoint that moved the run to v2 is the observe's own commit, by the worker that
        # committed the phase, with the migrated state.
        moved = [h for h in client.store.checkpoints(run_id) if h.agent_version == "2"][0]
        assert moved.ran is not None and moved.ran.phase is Phase.OBSERVING
        assert (moved.ran.pid, moved.state) == (committer.main_pids[0], {"migrated_from": "1"})
        calls = r.lrange(MIGRATED_KEY.format(run_id), 0, -1)
        if kill:
            # Migrated twice (the killed delivery's migration was never committed), committed once.
            assert calls == [f"2:{v2a.main_pids[0]}", f"2:{v2b.main_pids[0]}"]
        else:
            assert calls == [f"2:{v2a.main_pids[0]}"]
