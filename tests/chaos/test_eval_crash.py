"""An eval survives its pool being SIGKILLed twice and its submitter being killed.

The eval is submitted by a real ``wesichain eval run --wait`` process, which is SIGKILLed once the
eval is under way; then the whole pool (every worker's process group) is SIGKILLed and restarted,
twice. The eval still completes with one run and one result per case, and the cap was never
exceeded (sampled from Redis throughout). Model calls are counted per case by the scripted model:
a case's model is asked once, or twice only when its think was cut by a kill and handed on (the
think's claim says so): model calls are at least once, case runs exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from producer.client import Client
from producer.evals.client import EvalClient
from shared.evals.store import Item, run_id_of
from shared.state import EvalLink, Phase, RunHead
from tests.agents_evals import CALLS_KEY
from tests.broker import Settings, broker_env, on_rabbitmq
from tests.chaos.support import EVAL_AGENTS, kill_pool, write_doubling_eval
from tests.eval_scorers import SCORED_KEY
from tests.harness import ROOT, RedisServer, WorkerProcess, wait_until

CASES = 120
CAP = 8


def test_an_eval_finishes_once_through_two_pool_kills_and_a_dead_submitter(
    server: RedisServer, eval_pool: list[WorkerProcess], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    spec = write_doubling_eval(tmp_path, "crash", "k", CASES, CAP)
    client = Client(Settings(redis_url=server.url, agents_module=EVAL_AGENTS))
    request.addfinalizer(client.close)
    evals = EvalClient(client)
    log = (tmp_path / "submitter.log").open("wb")
    submitter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "producer.cli",
            "eval",
            "run",
            str(spec),
            "--wait",
            "--redis",
            server.url,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **broker_env(server.url)},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            samples.append(client.store.inflight(None))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        eval_id: str = wait_until(lambda: evals.store.list_evals(1), timeout=60, what="the eval")[0]
        wait_until(lambda: evals.progress(eval_id).recorded >= 6, timeout=60, what="first results")
        assert submitter.poll() is None, (tmp_path / "submitter.log").read_text()
        os.killpg(submitter.pid, signal.SIGKILL)  # the laptop closes: the pool carries on
        submitter.wait(timeout=10)
        wait_until(lambda: evals.progress(eval_id).recorded >= CASES // 4, timeout=90, what="a quarter")
        kill_pool(eval_pool)
        wait_until(lambda: evals.progress(eval_id).recorded >= CASES * 3 // 5, timeout=120, what="60%")
        kill_pool(eval_pool)
        done = evals.wait(eval_id, timeout=180)
    finally:
        if submitter.poll() is None:
            os.killpg(submitter.pid, signal.SIGKILL)
            submitter.wait(timeout=10)
        stop.set()
        sampler.join()
    # The client stays open for the reads below: a closed cluster client cannot be used again.
    assert done.meta.status == "completed" and done.recorded == CASES
    assert (done.counts[0].done, done.counts[0].passed, done.counts[0].failed) == (CASES, CASES, 0)
    results = evals.results(eval_id)
    assert sorted(r.case_id for r in results) == sorted(f"k{m}" for m in range(1, CASES + 1))
    # One run per case: every run on this server is a case run, named by its work item.
    runs = Counter(h.link.item if isinstance(h.link, EvalLink) else None for h in _all_runs(evals))
    assert runs == Counter({str(Item(0, c, 0)): 1 for c in range(CASES)})
    # Model calls: once, or twice where a kill cut the think and it was handed on: the think that
    # ended the run was the second claim of its version. On the Redis broker only the sweeper hands
    # a cut think on (a new epoch); RabbitMQ gives the dead worker's message back at once, and its
    # redelivery claims the think again once the dead claim's lease ran out (same epoch).
    r = server.client()
    calls = {str(k).split("|", 1)[1]: int(v) for k, v in r.hgetall(CALLS_KEY).items()}
    assert set(calls) == {f"slow double {m}" for m in range(1, CASES + 1)}
    for m in range(1, CASES + 1):
        if calls[f"slow double {m}"] != 1:
            head = evals.client.store.load(run_id_of(eval_id, Item(0, m - 1, 0)))
            assert head is not None and head.ran is not None and calls[f"slow double {m}"] == 2, m
            assert (head.ran.phase, head.ran.attempt) == (Phase.THINKING, 2), (m, head.ran)
            assert on_rabbitmq() or head.epoch >= 1, (m, head.epoch)
    # Scored once each, but where a kill cut a scoring (its result was never recorded).
    scored = {str(k): int(v) for k, v in r.hgetall(SCORED_KEY).items()}
    assert set(scored) == {f"k{m}" for m in range(1, CASES + 1)} and max(scored.values()) <= 2
    assert sum(scored.values()) - CASES <= 2 * 6
    # The cap held across the pool the whole time, and was used.
    assert samples and max(samples) <= CAP and max(samples) >= CAP // 2


def _all_runs(evals: EvalClient) -> list[RunHead]:
    heads: list[RunHead] = []
    cursor = None
    while True:
        page = evals.client.list_runs(limit=500, cursor=cursor)
        heads += page.runs
        cursor = page.next_cursor
        if not cursor:
            return heads
