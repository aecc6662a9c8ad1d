"""Every task delivered twice, and old tasks delivered late: nothing happens twice, nothing goes back.

A duplicate delivery finds another delivery holding the phase (busy) or the run already past it
(stale). A late delivery from before a takeover carries an old epoch or an old version, and the
run's fencing turns it away even when it arrives with Celery's "redelivered" marks.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from producer.client import Client
from shared.state import Phase
from tests.agents_fixture import RELEASE_KEY
from tests.broker import DELIVERIES_KEY, Settings
from tests.chaos.support import (
    RUN_TIMEOUT_S,
    SHAPES,
    Cluster,
    RunSnapshot,
    check_clean_run,
    effects,
    idem,
    pending_task_ids,
    snapshot,
    starts,
    wait_delivered,
    wait_paused,
    wait_tool_started,
)
from tests.conftest import _need_redis
from tests.harness import RedisServer, WorkerProcess, wait_until

#: Leases long enough that no sweeper takeover mixes into the pure-duplicate test.
CALM_ENV = {"WESICHAIN_LEASE_S": "10", "WESICHAIN_QUEUED_LEASE_S": "30"}


#: Tasks a run of each agent needs without faults: start, then per step think + its calls + observe,
#: then the final think.
TASKS = {agent: 2 + sum(n + 2 for n in shape) for agent, shape in SHAPES.items()}
WORKLOAD = ["one_hop"] * 8 + ["chain"] * 4 + ["parallel"] * 3


@dataclass(repr=False)
class DuplicatedWorkload:
    client: Client
    runs: list[tuple[str, str]]
    workers: list[WorkerProcess]
    before: dict[str, RunSnapshot]
    after: dict[str, RunSnapshot]
    #: Task id -> how many times the broker delivered it to a worker (counted by the delivery probe).
    deliveries: dict[str, int]
    error: BaseException | None = None


@pytest.fixture(scope="module")
def duplicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DuplicatedWorkload]:
    """One workload on workers that publish every task twice (and a producer that sends each start
    twice), run once and checked by the tests below."""
    _need_redis()
    server = RedisServer().start()
    cluster = Cluster(server, tmp_path_factory.mktemp("duplicates"))
    client = Client(Settings(redis_url=server.url, agents_module="tests.agents_fixture"))
    try:
        workers = cluster.start(
            2,
            concurrency=2,
            env={**CALM_ENV, "WESICHAIN_FAULT": "duplicate_publish"},
            include=("tests.delivery_probe",),
        )
        runs: list[tuple[str, str]] = []
        for agent in WORKLOAD:
            handle = client.submit(agent, "go")
            client.app.send_task("wesichain.start", kwargs={"run_id": handle.run_id, "version": 1})
            runs.append((handle.run_id, agent))
        error: BaseException | None = None
        try:
            for run_id, agent in runs:
                check_clean_run(client, run_id, agent)
        except AssertionError as exc:
            error = exc
        before = {run_id: snapshot(client, run_id) for run_id, _ in runs}
        # Let every leftover duplicate be delivered; none may change anything.
        r = client.store.redis
        wait_until(lambda: not pending_task_ids(r), 120, interval=0.1, what="the broker to drain")
        after = {run_id: snapshot(client, run_id) for run_id, _ in runs}
        deliveries = {str(k): int(v) for k, v in r.hgetall(DELIVERIES_KEY).items()}
        yield DuplicatedWorkload(client, runs, workers, before, after, deliveries, error)
    finally:
        client.close()
        cluster.stop()
        server.cleanup()


def test_every_task_delivered_twice(duplicated: DuplicatedWorkload) -> None:
    if duplicated.error is not None:
        raise duplicated.error
    assert duplicated.after == duplicated.before
    assert all(w.alive for w in duplicated.workers)
    # The duplicates really were delivered: each task id of the first run arrived twice.
    run_id = duplicated.runs[0][0]
    for task_id in (f"{run_id}:v2:think", f"{run_id}:v3:tool:call_0", f"{run_id}:v4:observe"):
        assert duplicated.deliveries.get(task_id, 0) >= 2, f"{task_id} was not delivered twice"


def test_duplicate_deliveries_are_absorbed_not_amplified(duplicated: DuplicatedWorkload) -> None:
    """A duplicate must die out, not travel on with the run re-publishing every phase after it."""
    needed = sum(TASKS[agent] for _, agent in duplicated.runs)
    # Every publish is doubled and every start sent twice: about 2 x needed deliveries; allow 3x that.
    bound = 3 * 2 * needed
    delivered = sum(duplicated.deliveries.values())
    assert delivered <= bound, (
        f"{delivered} task deliveries for {needed} tasks published twice each: stale duplicates "
        f"re-published outboxes that were already published (bound {bound})"
    )


def test_late_deliveries_after_a_takeover_change_nothing(cluster: Cluster, client: Client) -> None:
    workers = cluster.start(2, concurrency=2, env={"WESICHAIN_FAULT": "pause:thinking"})
    r = client.store.redis
    handle = client.submit("late_delivery", "go")
    run_id = handle.run_id
    # Kill the worker thinking step 1; the sweeper bumps the epoch and the survivor goes on.
    cluster.owner(wait_paused(r, Phase.THINKING, run_id)).kill()
    cluster.revive(wait=True)
    wait_tool_started(r, idem(run_id, 2), timeout=RUN_TIMEOUT_S)
    head = handle.status()
    assert head.phase is Phase.ACTING and head.step == 2 and head.epoch >= 1
    version, epoch = head.version, head.epoch

    ids = itertools.count()

    def task(name: str, step: int, version: int, epoch: int, **extra: Any) -> tuple[str, dict[str, Any]]:
        return f"wesichain.{name}", {
            "run_id": run_id,
            "step": step,
            "version": version,
            "epoch": epoch,
            **extra,
        }

    call = {"call_id": "call_0"}
    # (task, retries): retries > 0 is how Celery marks a task redelivered after its worker was lost.
    late: list[tuple[tuple[str, dict[str, Any]], int]] = [
        (("wesichain.start", {"run_id": run_id, "version": 1, "epoch": 0}), 0),
        # The very delivery the killed worker held, as Celery would redeliver it.
        (task("think", 1, 2, 0), 1),
        (task("think", 1, 2, epoch), 0),
        (task("tool", 1, 3, 0, **call), 0),
        (task("tool", 1, 3, epoch, **call), 1),
        (task("observe", 1, 4, epoch), 0),
        (task("think", 2, 5, epoch), 1),
        # The call running right now, from before the takeover: only the epoch fences it off,
        # even when it claims to be a redelivery that may take a claim over.
        (task("tool", 2, version, 0, **call), 0),
        (task("tool", 2, version, 0, **call), 1),
    ]

    def replay() -> list[str]:
        sent = []
        for (name, kwargs), retries in late:
            task_id = f"late-{next(ids)}"
            client.app.send_task(name, kwargs=kwargs, task_id=task_id, retries=retries)
            sent.append(task_id)
        return sent

    wait_delivered(r, replay(), timeout=30)
    during = handle.status()
    assert during.phase is Phase.ACTING and during.version == version, "the late tasks moved the run"
    assert starts(r, idem(run_id, 2)) == 1, "an old-epoch delivery started the running call again"
    assert starts(r, idem(run_id, 1)) == 0 and effects(r, idem(run_id, 1)) == 1

    r.set(RELEASE_KEY + run_id, 1)
    check_clean_run(client, run_id, "late_delivery")
    assert starts(r, idem(run_id, 2)) == 1
    done = handle.status()
    assert done.epoch == epoch
    # Once more after the end: a terminal run ignores everything.
    before = snapshot(client, run_id)
    wait_delivered(r, replay(), timeout=30)
    assert snapshot(client, run_id) == before
    assert all(w.alive for w in workers)
