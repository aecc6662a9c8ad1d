"""Prometheus metrics scraped from real exporters after real runs on real workers.

Two ``wesichain worker`` processes (a prefork pool of two children, whose counts only add up in
prometheus-client's multiprocess mode, and a thread pool) serve ``/metrics`` each, and
``wesichain metrics`` serves the pool's state read from Redis and the broker; the test scrapes
them over HTTP after runs whose every phase, model call and tool call it can count in advance.
The module has its own redis-server, so no other test's runs are counted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from producer.client import Client
from shared.tasks import TASK_THINK
from tests.broker import Settings
from tests.harness import ROOT, RedisServer, WorkerProcess, free_port, stop_all, wait_until
from tests.scrape import scrape, total, value

pytestmark = pytest.mark.redis_broker

TIMEOUT = 60
#: The runs submitted, by agent (tests/agents_fixture.py), and what each does.
RUNS = {"direct": 5, "one_hop": 3, "tool_error_fail": 2, "model_fail": 2}


@dataclass
class Pool:
    server: RedisServer
    client: Client
    exporter: int
    workers: list[WorkerProcess]
    ports: list[int]


def _exporter(url: str, port: int, log_dir: str) -> subprocess.Popen[bytes]:
    with open(os.path.join(log_dir, "exporter.log"), "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "producer.cli", "metrics", "--redis", url, "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    server = RedisServer().start()
    log_dir = str(tmp_path_factory.mktemp("metrics"))
    exporter_port = free_port()
    exporter = _exporter(server.url, exporter_port, log_dir)
    client = Client(Settings(redis_url=server.url, agents_module="tests.agents_fixture"))
    ports = [free_port(), free_port()]
    workers = [
        # Every tool call runs in a pool child of m1: only multiprocess mode brings them to /metrics.
        WorkerProcess(
            "m1", server.url, pool="prefork", concurrency=2, queues="wesichain.tools", log_dir=log_dir
        ),
        WorkerProcess(
            "m2",
            server.url,
            pool="threads",
            concurrency=4,
            queues="wesichain.model,wesichain.callbacks",
            log_dir=log_dir,
        ),
    ]
    for worker, port in zip(workers, ports, strict=True):
        worker.args[worker.args.index("--loglevel") : worker.args.index("--loglevel")] = [
            "--metrics-port",
            str(port),
        ]
    try:
        wait_until(lambda: _answers(exporter_port), timeout=30, what="the exporter to serve")
        yield Pool(server, client, exporter_port, workers, ports)
    finally:
        stop_all(workers)
        exporter.terminate()
        exporter.wait(timeout=10)
        client.close()
        server.cleanup()


def _answers(port: int) -> bool:
    try:
        scrape(port)
    except Exception:
        return False
    return True


def test_counts_of_real_runs_add_up_across_pool_processes(pool: Pool) -> None:
    client = pool.client
    # Before any worker runs: the exporter sees the backlog in the broker and the runs in flight.
    queued = [client.submit("direct", f"queued {i}", check_agent=False) for i in range(RUNS["direct"])]
    before = scrape(pool.exporter)
    assert value(before, "wesichain_up") == 1
    assert value(before, "wesichain_queue_depth", queue="wesichain.model") == RUNS["direct"]
    assert value(before, "wesichain_queue_depth", queue="wesichain.tools") == 0
    assert value(before, "wesichain_runs_in_flight", tenant="-") == RUNS["direct"]
    assert value(before, "wesichain_workers") == 0

    for worker in pool.workers:
        worker.start(wait=False)
    for worker in pool.workers:
        worker.wait_ready()
    handles = queued + [
        client.submit(agent, f"{agent} {i}")
        for agent, n in RUNS.items()
        if agent != "direct"
        for i in range(n)
    ]
    ends = {h.run_id: h.wait(TIMEOUT).phase.value for h in handles}
    assert sorted(ends.values()).count("completed") == RUNS["direct"] + RUNS["one_hop"]

    # A duplicate delivery of a think that already happened: dropped, and counted as such.
    done = client.handle(queued[0].run_id).status()
    client.app.send_task(TASK_THINK, kwargs={"run_id": done.run_id, "step": 1, "version": 2, "epoch": 0})
    wait_until(
        lambda: (
            value(total(pool.ports), "wesichain_duplicate_deliveries_dropped_total", task=TASK_THINK) == 1
        ),
        timeout=TIMEOUT,
        what="the duplicate to be dropped",
    )

    s = total(pool.ports)
    for agent, n in RUNS.items():
        assert value(s, "wesichain_runs_started_total", agent=agent) == n, agent
    assert value(s, "wesichain_runs_ended_total", agent="direct", status="completed", error_kind="none") == 5
    assert value(s, "wesichain_runs_ended_total", agent="one_hop", status="completed", error_kind="none") == 3
    assert value(s, "wesichain_runs_ended_total", agent="tool_error_fail", error_kind="ToolDispatch") == 2
    assert value(s, "wesichain_runs_ended_total", agent="model_fail", error_kind="ModelTransport") == 2
    assert value(s, "wesichain_runs_ended_total") == sum(RUNS.values())

    # Model calls: direct 1 each, one_hop 2, tool_error_fail 1, model_fail 1 (a 503 from the model).
    calls = {"direct": 5, "one_hop": 6, "tool_error_fail": 2}
    for model, n in calls.items():
        assert value(s, "wesichain_model_calls_total", provider="scripted", model=model, outcome="ok") == n
        assert value(s, "wesichain_model_tokens_total", model=model, direction="in") == 10 * n
        assert value(s, "wesichain_model_tokens_total", model=model, direction="out") == 5 * n
    assert value(s, "wesichain_model_calls_total", model="model_fail", outcome="http_5xx") == 2
    assert value(s, "wesichain_model_call_errors_total", model="model_fail", kind="http_5xx") == 2
    assert value(s, "wesichain_model_call_duration_seconds_count") == 15

    assert value(s, "wesichain_tool_calls_total", tool="add", outcome="ok") == 3
    assert value(s, "wesichain_tool_calls_total", tool="boom", outcome="error") == 2
    assert value(s, "wesichain_tool_call_errors_total", tool="boom", kind="ToolDispatch") == 2
    assert value(s, "wesichain_tool_call_duration_seconds_count") == 5
    assert value(scrape(pool.ports[0]), "wesichain_tool_calls_total") == 5  # all in m1's children

    # Phases: every start, think, tool call and observe was claimed once and timed once.
    phases = {"idle": 12, "thinking": 15, "acting": 5, "observing": 5}
    for phase, n in phases.items():
        assert value(s, "wesichain_phase_duration_seconds_count", phase=phase) == n, phase
    assert value(s, "wesichain_queue_wait_seconds_count", queue="wesichain.model") == 12 + 15 + 5
    assert value(s, "wesichain_queue_wait_seconds_count", queue="wesichain.tools") == 5
    assert value(s, "wesichain_sweeper_takeovers_total") == 0
    assert value(s, "wesichain_commits_fenced_total") == 0

    after = scrape(pool.exporter)
    assert value(after, "wesichain_queue_depth") == 0
    assert value(after, "wesichain_runs_in_flight") == 0
    assert value(after, "wesichain_runs_parked") == 0
    assert value(after, "wesichain_workers", consuming="true") == 2


def test_a_worker_refuses_a_metrics_port_it_cannot_serve(
    pool: Pool, tmp_path: pytest.TempPathFactory
) -> None:
    taken = pool.ports[1]  # served by m2 already
    worker = WorkerProcess("m3", pool.server.url, pool="threads", log_dir=str(tmp_path))
    worker.args[worker.args.index("--loglevel") : worker.args.index("--loglevel")] = [
        "--metrics-port",
        str(taken),
    ]
    worker.start(wait=False)
    assert worker.proc is not None
    assert worker.proc.wait(timeout=30) == 2
    worker.stop()
    assert f"metrics port {taken}" in worker.log()
