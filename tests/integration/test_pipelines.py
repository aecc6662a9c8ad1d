"""Pipelines of runs on a real redis-server and real prefork workers: then, map (its cap), reduce
(item order), branch, the step policies, cancel, the CLI, and a queue namespace.

The agents (``tests/agents_pipelines.py``) count every model call per (agent, input) in Redis, so a
test can tell each child run asked its model exactly once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from producer.cli import main
from producer.client import Client
from producer.pipelines import PipelineConflict, UnknownPipeline
from shared.pipeline.store import PipelineStore, child_run_id
from shared.state import Phase
from tests.agents_pipelines import CALLS_KEY
from tests.broker import Settings, broker_env, queued
from tests.conftest import own_store
from tests.harness import RedisServer, WorkerProcess, running, wait_until
from tests.redis_cluster import RedisCluster

AGENTS = "tests.agents_pipelines"


@pytest.fixture(scope="module")
def server(redis_cluster: RedisCluster | None) -> Iterator[RedisServer]:
    with own_store(redis_cluster) as s:  # the shared cluster with --store cluster
        yield s


@pytest.fixture(scope="module")
def pool(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    log_dir = str(tmp_path_factory.mktemp("pipeline-workers"))
    env = {"PIPE_SLOW_S": "0.2", "PIPE_CAP": "8"}
    workers = [
        WorkerProcess(f"p{i}", server.url, agents=AGENTS, concurrency=4, log_dir=log_dir, env=env)
        for i in (1, 2)
    ]
    with running(workers) as started:
        yield started


@pytest.fixture
def client(server: RedisServer, pool: list[WorkerProcess]) -> Iterator[Client]:
    c = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    yield c
    c.close()


def calls(server: RedisServer, agent: str) -> dict[str, int]:
    r: redis.Redis = server.client()
    prefix = f"{agent}|"
    raw = {str(k): int(v) for k, v in r.hgetall(CALLS_KEY).items()}
    return {k[len(prefix) :]: v for k, v in raw.items() if k.startswith(prefix)}


def test_then_hands_each_answer_on(client: Client, server: RedisServer) -> None:
    handle = client.submit_pipeline("chain", "first", pipeline_id="chain-1")
    status = handle.wait(timeout=60)
    assert status.status == "completed"
    assert status.output == "done again done first"
    assert [(s.name, s.kind, s.total, s.done) for s in status.steps] == [
        ("worker", "then", 1, 1),
        ("worker-2", "then", 1, 1),
    ]
    assert [c.run_id for s in status.steps for c in s.children] == [
        child_run_id("chain-1", 0, 0, 0),
        child_run_id("chain-1", 1, 0, 0),
    ]
    assert client.handle(child_run_id("chain-1", 1, 0, 0)).status().input == "again done first"
    # The same id and request again is the same pipeline run: nothing runs twice.
    assert client.submit_pipeline("chain", "first", pipeline_id="chain-1").wait(10).status == "completed"
    counted = calls(server, "worker")
    assert (counted["first"], counted["again done first"]) == (1, 1)
    # Ended: its keys expire after the retention, like an ended run's. The worker sets their
    # expiry just after it writes the end the status reads: waited for, not assumed.
    keys = client.store.keys
    ended = (keys.pipe_meta("chain-1"), keys.pipe_events("chain-1"), keys.pipe_results("chain-1", 1))

    def ttls() -> list[int]:
        return [client.store.redis.ttl(key) for key in ended]

    wait_until(lambda: -1 not in ttls(), 30, what="the ended pipeline's keys to expire")
    for ttl in ttls():
        assert 0 < ttl <= client.settings.retention_s
    kinds = [e["kind"] for e in handle.events(follow=False)]
    assert kinds == [
        "pipeline_started",
        "step_started",
        "child_started",
        "child_ended",
        "step_started",
        "child_started",
        "child_ended",
        "pipeline_completed",
    ]


def test_map_100_items_within_cap_then_reduce_in_item_order(client: Client, server: RedisServer) -> None:
    items = [f"slow m{i}" for i in range(100)]
    store = PipelineStore(client.store.redis, client.store.keys)
    samples: list[tuple[int, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            meta = store.meta("fan-100")
            live_items = meta.started - meta.done if meta is not None and meta.kind == "map" else 0
            samples.append((client.store.inflight(None), live_items))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        status = client.submit_pipeline("fan", ",".join(items), pipeline_id="fan-100").wait(timeout=240)
    finally:
        stop.set()
        sampler.join()
    assert status.status == "completed", status.error
    split, mapped, reduced = status.steps
    assert (split.kind, mapped.kind, reduced.kind) == ("then", "map", "reduce")
    assert (mapped.total, mapped.done) == (100, 100)
    assert all(c.status == "completed" for c in mapped.children)
    # Never more than 8 live child runs (the steps run one after the other), and the cap was used.
    assert len(samples) > 20
    assert max(runs for runs, _ in samples) <= 8
    assert max(live for _, live in samples) <= 8
    assert max(runs for runs, _ in samples) >= 6
    assert status.output == " | ".join(f"{i}:done slow m{i}" for i in range(100))
    worker_calls = calls(server, "worker")
    assert {item: worker_calls.get(item) for item in items} == {item: 1 for item in items}
    assert "fan-100" not in store.active()


def test_branch_follows_the_typed_output(client: Client, server: RedisServer) -> None:
    math = client.submit_pipeline("routed", "what is 2+2", pipeline_id="route-math").wait(60)
    words = client.submit_pipeline("routed", "what is a word", pipeline_id="route-words").wait(60)
    assert (math.status, math.output) == ("completed", "done math for math")
    assert (words.status, words.output) == ("completed", "words for words")
    assert [s.pipeline for s in math.steps] == ["routed", "math"]
    assert math.steps[1].via == [{"branch": "branch", "case": "math", "to": "math"}]


def test_failing_child_fails_the_pipeline_with_its_step(client: Client) -> None:
    status = client.submit_pipeline("fan", "a,fail b,c", pipeline_id="fan-fail").wait(60)
    assert status.status == "failed"
    error = status.error or {}
    assert (error["step"], error["item"], error["seq"]) == ("worker", 1, 1)
    assert error["run_id"] == child_run_id("fan-fail", 1, 1, 0)
    assert error["kind"] == error["child_error"]["kind"]
    assert "scripted failure" in error["message"]
    assert [s.name for s in status.steps] == ["splitter", "worker"]  # the reduce never started


def test_skip_policy_leaves_the_failed_item_out(client: Client) -> None:
    status = client.submit_pipeline("fan-skip", "a,fail b,c", pipeline_id="fan-skip").wait(60)
    assert status.status == "completed", status.error
    assert [c.status for c in status.steps[1].children] == ["completed", "skipped", "completed"]
    assert status.output == "0:done a | 1:done c"


def test_retry_policy_runs_a_new_child(client: Client, server: RedisServer) -> None:
    status = client.submit_pipeline("fan-retry", "a,flaky b", pipeline_id="fan-retry").wait(60)
    assert status.status == "completed", status.error
    flaky = status.steps[1].children[1]
    assert (flaky.attempt, flaky.status) == (1, "completed")
    assert flaky.run_id == child_run_id("fan-retry", 1, 1, 1)
    assert client.handle(child_run_id("fan-retry", 1, 1, 0)).status().status == "failed"
    assert calls(server, "worker")["flaky b"] == 2
    assert status.output == "0:done a | 1:done flaky b"
    # Retries exhausted: the pipeline fails.
    failed = client.submit_pipeline("fan-retry", "fail x", pipeline_id="fan-retry-2").wait(60)
    assert failed.status == "failed"
    assert (failed.error or {})["run_id"] == child_run_id("fan-retry-2", 1, 0, 1)


def test_cancel_mid_map_cancels_every_live_child(client: Client, server: RedisServer) -> None:
    items = ",".join(f"slow c{i}" for i in range(40))
    handle = client.submit_pipeline("fan", items, pipeline_id="fan-cancel")
    wait_until(
        lambda: sum(c.status == "completed" for s in handle.status().steps[1:] for c in s.children) >= 3, 60
    )
    assert handle.cancel() == "ok"
    status = handle.status()
    assert status.status == "cancelled"
    mapped = status.steps[1]
    live = [c.run_id for c in mapped.children if c.status == "running"]
    assert live
    for run_id in live:
        assert run_id is not None
        assert client.handle(run_id).wait(30).status in ("interrupted", "completed")
    # Nothing new starts after the cancel.
    started = {c.item for c in handle.status().steps[1].children if c.run_id is not None}
    assert len(started) < 40
    wait_until(lambda: client.store.inflight(None) == 0, 30)
    # A child whose item was taken just before the cancel may be noted just after it: its creator
    # sees the pipeline ended and cancels it at once. No other item starts.
    late = {c.item: c.run_id for c in handle.status().steps[1].children if c.run_id is not None}
    for item in set(late) - started:
        head = client.store.load(late[item] or "")
        assert head is not None and head.phase is Phase.INTERRUPTED, f"item {item} started after the cancel"
    assert "fan-cancel" not in PipelineStore(client.store.redis, client.store.keys).active()
    # What the cancelled children recorded after the cancel expires with the rest.
    results = client.store.keys.pipe_results("fan-cancel", 1)
    assert client.store.redis.exists(results) and client.store.redis.ttl(results) > 0


def test_unknown_pipeline_and_bad_input_refused_at_submit(client: Client) -> None:
    with pytest.raises(UnknownPipeline, match="unknown pipeline 'nope'"):
        client.submit_pipeline("nope", "x")
    with pytest.raises(Exception, match="takes a Route as JSON"):
        client.submit_pipeline("words", "not json")


def test_cli_run_status_cancel(
    server: RedisServer,
    pool: list[WorkerProcess],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in broker_env(server.url).items():  # the CLI's topology (a cluster?)
        monkeypatch.setenv(name, value)
    common = ["--redis", server.url, "--agents", AGENTS]
    assert main(["pipeline", "run", "chain", "cli", "--id", "cli-1", "--timeout", "60", *common]) == 0
    out = capsys.readouterr().out
    assert "completed" in out and "done again done cli" in out
    assert main(["pipeline", "status", "cli-1", "--json", *common]) == 0
    assert '"status": "completed"' in capsys.readouterr().out
    assert main(["pipeline", "cancel", "cli-1", *common]) == 0
    assert "already completed" in capsys.readouterr().out
    assert main(["pipeline", "status", "missing", *common]) == 1


@pytest.mark.parametrize(
    ("pipeline", "kind", "message"),
    [
        (
            "broken-map",
            "PipelineStepError",
            "step 'worker': a mapping function raised ValueError: no items today",
        ),
        ("broken-branch", "PipelineStepError", "choose() gave 'elsewhere', not one of its cases (math)"),
        ("no-such-pipeline", "UnknownPipeline", "unknown pipeline 'no-such-pipeline'"),
    ],
)
def test_step_errors_end_the_pipeline_failed(client: Client, pipeline: str, kind: str, message: str) -> None:
    status = client.submit_pipeline(pipeline, "a,b", check=False).wait(60)
    assert status.status == "failed"
    error = status.error or {}
    assert error["kind"] == kind
    assert message in error["message"]
    assert all(c.status == "completed" for s in status.steps for c in s.children)  # no child failed


def test_a_step_starts_from_the_state_the_run_before_it_ended_with(client: Client) -> None:
    handle = client.submit_pipeline("tallied", "first", pipeline_id="tallied-1")
    status = handle.wait(timeout=60)
    assert status.status == "completed", status
    states = [
        client.handle(child_run_id("tallied-1", seq, item, 0)).status().state
        for seq, item in ((0, 0), (1, 0))
    ]
    assert states == [{"noted": ["first"]}, {"noted": ["first", "then noted first"]}]
    mapped = [client.handle(child_run_id("tallied-1", 2, item, 0)).status().state for item in (0, 1)]
    assert mapped == [
        {"noted": ["first", "then noted first", "x noted then noted first"]},
        {"noted": ["first", "then noted first", "y noted then noted first"]},
    ]


NAMESPACE = "pipes-ns"


def test_a_pipeline_run_in_a_queue_namespace_waits_for_and_runs_only_on_that_namespace_s_workers(
    server: RedisServer,
    pool: list[WorkerProcess],
    client: Client,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in broker_env(server.url).items():  # the CLI's topology (a cluster?)
        monkeypatch.setenv(name, value)
    common = ["--redis", server.url, "--agents", AGENTS]
    assert main(["pipeline", "submit", "fan", "x,y", "--id", "ns-1", "--namespace", NAMESPACE, *common]) == 0
    assert capsys.readouterr().out.strip() == "ns-1"
    # Its first move waits in the namespace's model queue, which no worker of the pool consumes.
    wait_until(
        lambda: queued(server.url, f"{NAMESPACE}.model") >= 1, timeout=30, what="its first move queued"
    )
    handle = client.pipeline("ns-1")
    assert handle.status().namespace == NAMESPACE
    spaced = WorkerProcess("pns", server.url, agents=AGENTS, log_dir=str(tmp_path), namespaces=(NAMESPACE,))
    with running([spaced]):
        status = handle.wait(timeout=90)
    assert status.status == "completed" and status.output == "0:done x | 1:done y", status
    children = [c.run_id for step in status.steps for c in step.children]
    assert len(children) == 4
    assert all(c is not None and client.handle(c).status().namespace == NAMESPACE for c in children)
    assert spaced.received("ns-1:") and "pipe:ns-1:advance" in spaced.log()
    assert [w.name for w in pool if w.received("ns-1:") or "pipe:ns-1" in w.log()] == []
    # The same id in another namespace is another request.
    with pytest.raises(PipelineConflict):
        client.submit_pipeline("fan", "x,y", pipeline_id="ns-1")
    assert client.submit_pipeline("fan", "x,y", pipeline_id="ns-1", namespace=NAMESPACE).pipeline_id == "ns-1"
