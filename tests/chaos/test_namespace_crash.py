"""A run in a queue namespace recovers onto that namespace's queues when its worker is SIGKILLed.

An eval's case runs go to the namespace ``nightly-chaos``. The only worker consuming it pauses each
run in its first think; it is SIGKILLed (its whole process group) while they are paused there. The
sweeper (running in every worker, the default pool's too) hands the thinks on, and publishes them
again to the namespace's queue: only a second worker consuming the namespace ever receives them,
and the eval completes, while the default worker receives none of the eval's tasks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from producer.client import Client
from producer.evals.client import EvalClient
from shared.evals.store import Item, run_id_of
from shared.state import Phase
from tests.broker import Settings
from tests.chaos.support import CHAOS_ENV, wait_paused
from tests.harness import RedisServer, WorkerProcess

AGENTS = "tests.agents_evals"
NAMESPACE = "nightly-chaos"
CASES = 6
#: Recovery's lease and queued lease, without the fault points (given to the first worker only).
LEASES = {k: v for k, v in CHAOS_ENV.items() if k.endswith("LEASE_S")}


@pytest.fixture
def default_worker(server: RedisServer, tmp_path: Path) -> Iterator[WorkerProcess]:
    log_dir = str(tmp_path)
    worker = WorkerProcess("default", server.url, agents=AGENTS, concurrency=2, env=LEASES, log_dir=log_dir)
    worker.start()
    yield worker
    worker.stop()


def test_a_namespaced_run_whose_worker_is_killed_mid_think_recovers_onto_the_namespace(
    server: RedisServer, default_worker: WorkerProcess, tmp_path: Path
) -> None:
    paused = {**CHAOS_ENV, "WESICHAIN_FAULT": "pause:thinking"}
    first, second = (
        WorkerProcess(
            name,
            server.url,
            agents=AGENTS,
            concurrency=3,
            env=env,
            log_dir=str(tmp_path),
            namespaces=(NAMESPACE,),
        )
        for name, env in (("ns-first", paused), ("ns-second", LEASES))
    )
    (tmp_path / "cases.jsonl").write_text(
        "".join(
            json.dumps({"id": f"c{m}", "input": f"double {m}", "expected": str(2 * m)}) + "\n"
            for m in range(1, CASES + 1)
        )
    )
    (tmp_path / "eval.toml").write_text(
        'name = "spaced"\ndataset = "cases.jsonl"\nconcurrency = 3\n'
        '[[variants]]\nagent = "doubler"\n[[scorers]]\nkind = "exact"\n'
    )
    client = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    evals = EvalClient(client)
    r = server.client()
    try:
        first.start()
        eval_id, _ = evals.submit_file(tmp_path / "eval.toml", namespace=NAMESPACE)
        victim = run_id_of(eval_id, Item(0, 0, 0))
        wait_paused(r, Phase.THINKING, victim, timeout=60)
        first.kill()
        first.stop()
        second.start()
        done = evals.wait(eval_id, timeout=180)
        heads = {row.run_id: client.store.load(row.run_id) for row in evals.results(eval_id)}
    finally:
        second.kill()
        second.stop()
        client.close()
    assert done.meta.status == "completed" and done.counts[0].passed == CASES
    assert all(h is not None and h.namespace == NAMESPACE for h in heads.values())
    victim_head = heads[victim]
    assert victim_head is not None
    # Its think was handed on by a sweeper (a new epoch), or taken over by the message RabbitMQ
    # handed back when the first worker died (a second claim at the same epoch): either way, run
    # again on the namespace's other worker.
    taken_over = victim_head.ran is not None and victim_head.ran.attempt >= 2
    assert victim_head.epoch >= 1 or taken_over, victim_head.ran
    assert first.received(victim) and second.received(victim)
    assert not default_worker.received(eval_id)
