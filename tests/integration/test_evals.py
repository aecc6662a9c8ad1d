"""Evals on a real redis-server and real prefork workers: counts, scores, the cap, cancel and resume.

The agents (``tests/agents_evals.py``) count every model call per (model, input) in Redis, so a test
can tell each case run asked its model exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from producer.client import Client
from producer.evals.client import EvalClient
from shared.evals.errors import EvalSpecError
from shared.evals.store import Item, run_id_of
from shared.keys import Keys
from shared.tenants import Tenants
from tests.agents_evals import CALLS_KEY
from tests.api_support import ApiProcess, bearer, wait_status
from tests.broker import Settings, broker_env, queued
from tests.conftest import InProcessCli, own_store
from tests.harness import ROOT, RedisServer, WorkerProcess, running, wait_until
from tests.redis_cluster import RedisCluster

AGENTS = "tests.agents_evals"
EVAL_QUEUE = "evals-test"


@pytest.fixture(scope="module")
def server(redis_cluster: RedisCluster | None) -> Iterator[RedisServer]:
    with own_store(redis_cluster) as s:  # the shared cluster with --store cluster
        yield s


@pytest.fixture(scope="module")
def pool(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    log_dir = str(tmp_path_factory.mktemp("eval-workers"))
    env = {"EVAL_SLOW_S": "0.2"}
    workers = [
        WorkerProcess(f"e{i}", server.url, agents=AGENTS, concurrency=3, log_dir=log_dir, env=env)
        for i in (1, 2)
    ]
    # Consumes only the eval queue of the test that names one: its scoring happens there.
    workers.append(
        WorkerProcess("eq", server.url, agents=AGENTS, concurrency=1, log_dir=log_dir, queues=EVAL_QUEUE)
    )
    with running(workers) as started:
        yield started


@pytest.fixture
def evals(server: RedisServer, pool: list[WorkerProcess]) -> Iterator[EvalClient]:
    client = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    yield EvalClient(client)
    client.close()


def write_eval(tmp: Path, cases: list[dict[str, Any]], **spec: Any) -> Path:
    (tmp / "cases.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases))
    lines = [f'name = "{spec.pop("name", "t")}"', 'dataset = "cases.jsonl"']
    for key, value in spec.pop("top", {}).items():
        lines.append(f"{key} = {json.dumps(value)}")
    for variant in spec.pop("variants", [{"name": "a", "agent": "doubler"}]):
        lines.append("[[variants]]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in variant.items()]
    for scorer in spec.pop("scorers", [{"kind": "exact"}]):
        lines.append("[[scorers]]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in scorer.items()]
    path = tmp / "eval.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


class CapSampler:
    """Samples, from Redis, the eval runs not ended (every run on this server is an eval's)."""

    def __init__(self, evals: EvalClient, eval_id: str) -> None:
        self.evals, self.eval_id = evals, eval_id
        self.samples: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            runs = self.evals.client.store.inflight(None)
            self.samples.append((runs, self.evals.store.in_flight(self.eval_id)))

    def __enter__(self) -> CapSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def calls(server: RedisServer) -> dict[str, int]:
    r: redis.Redis = server.client()
    return {str(k): int(v) for k, v in r.hgetall(CALLS_KEY).items()}


#: The big eval's cases. With 2 variants x 2 repeats they make 520 results: more than one HSCAN
#: batch (500) of the results hash (a 520-entry hash takes two HSCAN calls, as 800 did), and over
#: 40 times the concurrency cap of 12, which the sampler sees held and used. 200 cases (800 case
#: runs) proved nothing more than these 520 case runs do.
CASES = 130
RESULTS = CASES * 2 * 2


def test_130_cases_x_2_variants_x_2_repeats(evals: EvalClient, server: RedisServer, tmp_path: Path) -> None:
    cases = [{"id": f"c{m}", "input": f"double {m}", "expected": str(2 * m)} for m in range(1, CASES + 1)]
    spec = write_eval(
        tmp_path,
        cases,
        name="big",
        top={"repeats": 2, "concurrency": 12, "pass_threshold": 0.9},
        variants=[
            {"name": "a", "agent": "doubler"},
            {"name": "b", "agent": "doubler", "model": "scripted:evals-b"},
        ],
        scorers=[
            {"kind": "exact"},
            {"kind": "custom", "name": "even", "function": "tests.eval_scorers:even_answer"},
            {"kind": "custom", "name": "flaky", "function": "tests.eval_scorers:raises_on_seven"},
        ],
    )
    eval_id, created = evals.submit_file(spec)
    assert created
    with CapSampler(evals, eval_id) as sampler:
        progress = evals.wait(eval_id, timeout=240)
    assert progress.meta.status == "completed" and progress.recorded == RESULTS
    a, b = progress.counts
    wrong_b = sum(1 for m in range(1, CASES + 1) if m % 3 == 0)  # evals-b answers these wrong
    # c7's "flaky" scorer raises: that case fails on both variants, both repeats, and nothing else.
    assert (a.done, a.failed, a.passed) == (2 * CASES, 0, 2 * CASES - 2)
    assert (b.done, b.failed, b.passed) == (2 * CASES, 0, 2 * CASES - 2 * wrong_b - 2)
    results = evals.results(eval_id)
    assert len(results) == RESULTS and len({r.run_id for r in results}) == RESULTS
    assert {r.run_id for r in results} == {
        run_id_of(eval_id, Item(v, c, r)) for v in range(2) for c in range(CASES) for r in range(2)
    }
    c7 = [r for r in results if r.case_id == "c7"]
    assert {r.error_kind for r in c7} == {"ScorerError"} and all(not r.passed for r in c7)
    c9b = next(r for r in results if r.case_id == "c9" and r.variant == "b")
    assert c9b.answer == "19" and [s.value for s in c9b.scores] == [0.0, 0.0, 1.0]
    assert c9b.scores[1].explanation == "19 is odd"
    # Every case run asked its model exactly once: twice per (model, case) with two repeats.
    counted = calls(server)
    assert counted == {
        f"{model}|double {m}": 2 for model in ("evals-a", "evals-b") for m in range(1, CASES + 1)
    }
    # The cap held across the pool: sampled eval runs in flight, and slots held.
    assert sampler.samples and max(runs for runs, _ in sampler.samples) <= 12
    assert max(slots for _, slots in sampler.samples) <= 12
    assert max(runs for runs, _ in sampler.samples) >= 6  # and it was used
    # Submitting the same eval again attaches to it: nothing runs twice.
    again, created = evals.submit_file(spec)
    assert (again, created) == (eval_id, False)
    assert evals.progress(eval_id).recorded == RESULTS and calls(server) == counted


def test_cancel_stops_new_case_runs_and_resume_finishes_them_once(
    evals: EvalClient, server: RedisServer, tmp_path: Path
) -> None:
    cases = [{"id": f"s{m}", "input": f"slow double {m}", "expected": str(2 * m)} for m in range(1, 41)]
    spec = write_eval(tmp_path, cases, name="slow", top={"concurrency": 3})
    eval_id, _ = evals.submit_file(spec)
    wait_until(lambda: evals.progress(eval_id).recorded >= 3, timeout=60, what="some results")
    assert evals.cancel(eval_id) == "running"
    stopped = evals.wait(eval_id, timeout=60)
    assert stopped.meta.status == "cancelled" and stopped.in_flight == 0
    assert 3 <= stopped.recorded < 40 and stopped.pending == 40 - stopped.recorded
    # Nothing starts while it is cancelled.
    started = sum(calls(server).get(f"evals-a|slow double {m}", 0) for m in range(1, 41))
    assert started == stopped.recorded
    assert evals.resume(eval_id) == "cancelled"
    done = evals.wait(eval_id, timeout=120)
    assert done.meta.status == "completed" and done.recorded == 40 and done.counts[0].passed == 40
    assert all(calls(server)[f"evals-a|slow double {m}"] == 1 for m in range(1, 41))


def test_a_case_run_that_fails_is_recorded_with_its_error(evals: EvalClient, tmp_path: Path) -> None:
    cases = [{"id": f"f{m}", "input": f"double {m}", "expected": str(2 * m)} for m in range(1, 4)]
    spec = write_eval(
        tmp_path,
        cases,
        name="fails",
        variants=[{"name": "x", "agent": "doubler", "model": "scripted:missing"}],
    )
    eval_id, _ = evals.submit_file(spec)
    done = evals.wait(eval_id, timeout=60)
    assert done.meta.status == "completed" and (done.counts[0].done, done.counts[0].failed) == (3, 3)
    for r in evals.results(eval_id):
        assert r.status == "failed" and not r.passed and r.scores == []
        assert r.error is not None and "missing" in r.error["message"]


@pytest.mark.parametrize(
    ("dataset", "scorers", "message"),
    [
        (
            '{"id": "a", "input": "double 1"}\n{"id": "b", "input": \n',
            [{"kind": "exact"}],
            "cases.jsonl:2: not valid JSON",
        ),
        ('{"id": "a", "input": "double 1"}\n', [{"kind": "bleu"}], "does not match any of the expected tags"),
        (
            '{"id": "a", "input": "double 1"}\n',
            [{"kind": "custom", "function": "tests.eval_scorers:gone"}],
            "scorer 'custom': module 'tests.eval_scorers' has no 'gone'",
        ),
    ],
)
def test_bad_input_is_refused_at_submit_and_creates_nothing(
    evals: EvalClient, tmp_path: Path, dataset: str, scorers: list[dict[str, Any]], message: str
) -> None:
    before = evals.store.list_evals(1000)
    spec = write_eval(tmp_path, [], name="bad", scorers=scorers)
    (tmp_path / "cases.jsonl").write_text(dataset)
    with pytest.raises(EvalSpecError) as info:
        evals.submit_file(spec)
    assert message in str(info.value)
    assert evals.store.list_evals(1000) == before


def test_an_llm_judge_grades_and_a_judge_that_answers_garbage_is_an_error_on_its_cases(
    evals: EvalClient, tmp_path: Path
) -> None:
    cases = [{"id": f"j{m}", "input": f"double {m}", "expected": str(2 * m)} for m in range(1, 7)]
    spec = write_eval(
        tmp_path,
        cases,
        name="judged",
        variants=[{"name": "b", "agent": "doubler", "model": "scripted:evals-b"}],
        scorers=[
            {"kind": "judge", "name": "strict", "model": "scripted:judge-strict", "rubric": "Is it right?"},
            {"kind": "judge", "name": "garbage", "model": "scripted:judge-garbage", "rubric": "Is it right?"},
        ],
    )
    eval_id, _ = evals.submit_file(spec)
    done = evals.wait(eval_id, timeout=60)
    assert done.meta.status == "completed" and done.counts[0].done == 6 and done.counts[0].passed == 0
    # 15 tokens per run, and 15 per judge call (two per case): the judges' count too.
    assert done.counts[0].tokens == 6 * (15 + 2 * 15)
    for r in evals.results(eval_id):
        strict, garbage = r.scores
        m = int(r.case_id[1:])
        assert (strict.value, strict.explanation) == ((0.0, "differs") if m % 3 == 0 else (1.0, "matches"))
        assert garbage.error and garbage.value == 0.0
        assert garbage.explanation == (
            "the scorer failed: JudgeVerdictError: the judge did not answer with JSON: 'Looks good to me!'"
        )


def test_a_token_budget_stops_starting_case_runs(evals: EvalClient, tmp_path: Path) -> None:
    cases = [{"id": f"b{m}", "input": f"double {m}", "expected": str(2 * m)} for m in range(1, 31)]
    spec = write_eval(tmp_path, cases, name="budget", top={"concurrency": 2})
    with spec.open("a") as f:
        f.write("[budget]\ntokens = 60\n")  # a run of the doubler costs 15 tokens
    eval_id, _ = evals.submit_file(spec)
    done = evals.wait(eval_id, timeout=60)
    assert done.meta.status == "budget_exhausted" and done.in_flight == 0
    # Runs start while less than the budget is used: at least 4 (60 / 15), at most the cap more.
    assert 4 <= done.recorded <= 4 + 2 and done.pending == 30 - done.recorded
    assert done.counts[0].tokens == 15 * done.recorded


def cli(server: RedisServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WESICHAIN_AGENTS": AGENTS, **broker_env(server.url)}
    return subprocess.run(
        [sys.executable, "-m", "producer.cli", "eval", *args, "--redis", server.url],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )


def test_the_cli_gates_ci_on_the_threshold_and_on_a_significant_regression(
    evals: EvalClient, server: RedisServer, tmp_path: Path, cli_in_process: InProcessCli
) -> None:
    cases = [{"id": f"g{m}", "input": f"double {m}", "expected": str(2 * m)} for m in range(1, 31)]
    spec = write_eval(
        tmp_path,
        cases,
        name="gate",
        top={"pass_threshold": 0.8, "concurrency": 6},
        variants=[
            {"name": "a", "agent": "doubler"},
            {"name": "b", "agent": "doubler", "model": "scripted:evals-b"},
        ],
    )
    # The gate CI sees: the exit status of a process of its own. The other commands run in this one.
    run = cli(server, "run", str(spec), "--wait", "--report", str(tmp_path / "r.html"))
    assert run.returncode == 1, run.stderr  # b passes 20 of 30: below 80%
    assert "below the pass threshold 80%: b" in run.stderr
    eval_id = run.stderr.split()[1]
    assert "  a: 30/30 done, 0 failed, pass 100.0%" in run.stdout
    assert "  b: 30/30 done, 0 failed, pass 66.7%" in run.stdout
    page = (tmp_path / "r.html").read_text()
    data = json.loads(page.split('<script type="application/json" id="eval-data">')[1].split("</script>")[0])
    assert [c["verdict"].split(" (")[0] for c in data["comparisons"]] == ["significant regression"]
    assert data["verdict"]["verdict"] == "mixed" and data["verdict"]["below"] == ["b"]

    def in_process(server: RedisServer, *args: str) -> subprocess.CompletedProcess[str]:
        env = {"WESICHAIN_AGENTS": AGENTS, **broker_env(server.url)}
        return cli_in_process("eval", *args, "--redis", server.url, env=env)

    assert in_process(server, "status", eval_id, "--gate").returncode == 1
    assert in_process(server, "status", eval_id).returncode == 0

    compared = in_process(server, "compare", eval_id, "--variants", "a", "b")
    assert compared.returncode == 1, compared.stderr
    assert (
        f"{eval_id}/a -> {eval_id}/b: 30 paired runs, pass 30/30 -> 20/30; 10 worse, 0 better:"
        in compared.stdout
    )
    assert "significant regression (p = 0.00195)" in compared.stdout
    assert "regressions: g12, g15, g18, g21, g24, g27, g3, g30, g6, g9" in compared.stdout
    same = in_process(server, "compare", eval_id, eval_id)  # each variant against itself: no change
    assert same.returncode == 0 and same.stdout.count("no significant change (p = 1)") == 2

    junit = in_process(server, "results", eval_id, "--format", "junit")
    assert (
        junit.returncode == 0
        and '<testsuite name="' + eval_id + '" tests="60" failures="10" errors="0"' in junit.stdout
    )
    rows = in_process(server, "results", eval_id, "--format", "csv").stdout.splitlines()
    assert rows[0].startswith("variant,case_id,repeat,passed,status,answer,error,steps") and len(rows) == 61
    jsonl = [json.loads(line) for line in in_process(server, "results", eval_id).stdout.splitlines()]
    assert len(jsonl) == 60 and {r["run_id"] for r in jsonl} == {r.run_id for r in evals.results(eval_id)}
    missing = in_process(server, "status", "no-such-eval")
    assert missing.returncode == 1 and "no eval 'no-such-eval'" in missing.stderr


def test_an_eval_with_its_own_queue_is_pumped_and_scored_by_the_workers_consuming_it(
    evals: EvalClient, pool: list[WorkerProcess], tmp_path: Path
) -> None:
    cases = [{"id": f"q{m}", "input": f"double {m}", "expected": str(2 * m)} for m in range(1, 9)]
    spec = write_eval(tmp_path, cases, name="queued", top={"queue": EVAL_QUEUE, "concurrency": 3})
    eval_id, _ = evals.submit_file(spec)
    done = evals.wait(eval_id, timeout=60)
    assert done.meta.status == "completed" and done.counts[0].passed == 8
    log = pool[2].log()
    assert (
        "Task wesichain.eval.pump[" in log and log.count("Task wesichain.eval.score[") >= 16
    )  # received, ran
    assert all("Task wesichain.eval.score[" not in w.log() for w in pool[:2])  # only it consumes the queue


NAMESPACE = "nightly-test"


def test_an_eval_in_a_queue_namespace_runs_only_on_the_workers_consuming_that_namespace(
    evals: EvalClient, server: RedisServer, pool: list[WorkerProcess], tmp_path: Path
) -> None:
    cases = [{"id": f"n{m}", "input": f"double {m}", "expected": str(2 * m)} for m in range(1, 9)]
    spec = write_eval(tmp_path, cases, name="spaced", top={"concurrency": 3})
    eval_id, _ = evals.submit_file(spec, namespace=NAMESPACE)
    # Its pump waits in the namespace's model queue, which no worker of the pool consumes.
    wait_until(lambda: queued(server.url, f"{NAMESPACE}.model") >= 1, timeout=30, what="its pump queued")
    progress = evals.progress(eval_id)
    assert (progress.in_flight, progress.recorded, progress.pending) == (0, 0, 8)
    spaced = WorkerProcess("ns", server.url, agents=AGENTS, log_dir=str(tmp_path), namespaces=(NAMESPACE,))
    spaced.start()
    try:
        done = evals.wait(eval_id, timeout=120)
    finally:
        spaced.stop()
    assert done.meta.status == "completed" and done.counts[0].passed == 8
    heads = [evals.client.store.load(row.run_id) for row in evals.results(eval_id)]
    assert [h.namespace if h else None for h in heads] == [NAMESPACE] * 8
    assert spaced.received(eval_id)
    assert [w.name for w in pool if w.received(eval_id)] == []


def test_a_tenants_run_cannot_forge_an_evals_results(
    evals: EvalClient, server: RedisServer, tmp_path: Path
) -> None:
    """An attacker's run names the eval's case in its metadata and the eval's scoring task as its
    callback (refused at submit), then a forged scoring message names it: the eval scores only its
    own case runs, finishes, and frees every slot."""
    cases = [{"id": f"f{m}", "input": f"slow double {m}", "expected": str(2 * m)} for m in range(1, 5)]
    spec = write_eval(tmp_path, cases, name="forged", top={"concurrency": 2})
    eval_id, _ = evals.submit_file(spec)
    forged = {"eval_id": eval_id, "eval_item": str(Item(0, 0, 0))}
    api = ApiProcess(server.url, env={"WESICHAIN_AGENTS": AGENTS}).start()
    try:
        key, _ = Tenants(server.client(), Keys()).create_key("eval-attacker")
        with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
            refused = http.post(
                "/v1/runs",
                json={
                    "agent": "doubler",
                    "input": "double 500",
                    "metadata": forged,
                    "callback": {"task": "wesichain.eval.score"},
                },
            )
            assert refused.status_code == 422 and "reserved" in refused.json()["error"]["message"]
            own = http.post("/v1/runs", json={"agent": "doubler", "input": "double 500", "metadata": forged})
            assert own.status_code == 202
            attacker_run = wait_status(http, own.json()["run_id"], {"completed"}, 60)
    finally:
        api.stop()
    evals.client.app.send_task(
        "wesichain.eval.score",
        args=[{**attacker_run, "metadata": forged, "status": "completed", "answer": "1000"}],
        queue="wesichain.model",
    )
    done = evals.wait(eval_id, timeout=120)
    assert done.meta.status == "completed" and done.recorded == 4 and done.in_flight == 0
    results = sorted(evals.results(eval_id), key=lambda r: r.case_id)
    assert [r.case_id for r in results] == ["f1", "f2", "f3", "f4"]
    assert all(r.passed for r in results)
    assert [r.run_id for r in results] == [run_id_of(eval_id, Item(0, c, 0)) for c in range(4)]


def test_an_eval_id_with_a_colon_is_refused_and_creates_nothing(evals: EvalClient, tmp_path: Path) -> None:
    """An eval's annotations are keyed by its tenant and its id joined with ':': tenant org's eval
    eu:x and tenant org:eu's eval x shared them, and each tenant's reviews showed on the other's."""
    before = evals.store.list_evals(1000)
    spec = write_eval(tmp_path, [{"id": "a", "input": "double 1", "expected": "2"}], name="colon")
    for given in ("eu:x", None):
        named = write_eval(tmp_path, [{"id": "a", "input": "double 1", "expected": "2"}], name="org:eu")
        with pytest.raises(EvalSpecError, match="holds ':'"):
            evals.submit_file(spec if given else named, eval_id=given)
    assert evals.store.list_evals(1000) == before
