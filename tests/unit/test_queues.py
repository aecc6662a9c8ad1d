"""Per-run routing: a run's queue namespace is checked, stored with its request, and every task
built from its head names that namespace's queue of its kind."""

from __future__ import annotations

import pytest

from shared.errors import InvalidRequest
from shared.evals.errors import EvalSpecError
from shared.evals.spec import parse_spec
from shared.messages import ToolCall
from shared.pool import MAX_EXTRA_QUEUES
from shared.queues import check_namespace, namespace_queues
from shared.request import validate_request
from shared.settings import Limits
from shared.state import Callback, ChildRun, Phase, RunHead
from shared.tasks import TASK_CALLBACK, decide_task, start_task, task_for
from shared.workers import LiveWorker, WorkerRecord
from worker.commands import consumed_queues
from worker.exporter import QUEUES, PoolCollector
from worker.metrics import queue_of
from worker.subagents import _child_head


def test_a_namespace_is_short_plain_text_and_the_default_one_is_none() -> None:
    assert check_namespace("nightly-evals_2") == "nightly-evals_2"
    assert check_namespace(None) is None
    assert check_namespace("wesichain") is None  # the pool's default queues
    for bad in ("", "a.b", "a b", "x" * 49, "-x", "ünï"):
        with pytest.raises(InvalidRequest, match="namespace"):
            check_namespace(bad)
    with pytest.raises(InvalidRequest, match="namespace must be text, got int"):
        check_namespace(7)
    assert namespace_queues("nightly") == ["nightly.model", "nightly.tools", "nightly.callbacks"]


def test_a_request_carries_its_namespace_and_a_bad_one_is_refused() -> None:
    request = validate_request({"agent": "a", "input": "hi", "namespace": "nightly"}, Limits())
    assert request.namespace == "nightly"
    with pytest.raises(InvalidRequest, match="namespace 'a.b' must be"):
        validate_request({"agent": "a", "input": "hi", "namespace": "a.b"}, Limits())


def _head(phase: Phase, namespace: str | None, **fields: object) -> RunHead:
    idle = RunHead.new_idle("r1", "a", "hi", namespace=namespace)
    return idle.model_copy(update={"phase": phase, "version": 4, "step": 2, **fields})


def test_every_task_of_a_namespaced_run_goes_to_its_kind_s_queue_in_the_namespace() -> None:
    calls = [ToolCall(id="c1", name="add", arguments={}), ToolCall(id="c2", name="add", arguments={})]
    cases = [
        (_head(Phase.IDLE, "n"), ["n.model"]),
        (_head(Phase.THINKING, "n"), ["n.model"]),
        (_head(Phase.ACTING, "n", pending_calls=calls), ["n.tools", "n.tools"]),
        (_head(Phase.OBSERVING, "n"), ["n.model"]),
        (_head(Phase.COMPLETED, "n", callback=Callback(task="x.done")), ["n.callbacks"]),
    ]
    for head, queues in cases:
        assert [t.queue for t in task_for(head)] == queues, head.phase
    assert task_for(cases[-1][0])[0].name == TASK_CALLBACK
    assert decide_task(_head(Phase.AWAITING_APPROVAL, "n")).queue == "n.model"
    assert start_task("r1", namespace="n").queue == "n.model"
    # Without a namespace nothing names a queue: the routes send them to wesichain.*, as ever.
    assert [t.queue for t in task_for(_head(Phase.ACTING, None, pending_calls=calls))] == [None, None]
    assert start_task("r1").queue is None and decide_task(_head(Phase.AWAITING_APPROVAL, None)).queue is None


def test_the_namespace_is_stored_once_with_the_request() -> None:
    head = RunHead.new_idle("r1", "a", "hi", namespace="n")
    assert '"namespace":"n"' in head.dump_request() and "namespace" not in head.dump_body()
    assert RunHead.compose(head.dump_body(), head.dump_request(), 0).namespace == "n"


def test_a_worker_consumes_the_queues_of_the_namespaces_it_is_given() -> None:
    assert consumed_queues(None, []) == "wesichain.model,wesichain.tools,wesichain.callbacks"
    assert consumed_queues(None, ["nightly"]) == "nightly.model,nightly.tools,nightly.callbacks"
    assert consumed_queues("wesichain.model", ["a", "a"]) == "wesichain.model,a.model,a.tools,a.callbacks"
    with pytest.raises(SystemExit, match="namespace 'a.b' must be"):
        consumed_queues(None, ["a.b"])


def test_an_eval_s_namespace_routes_its_own_tasks_unless_it_names_a_queue() -> None:
    base = {"name": "e", "dataset": "d.jsonl", "variants": [{"agent": "a"}], "scorers": [{"kind": "exact"}]}
    plain = parse_spec(base)
    assert plain.namespace is None and plain.task_queue is None
    spaced = plain.with_namespace("nightly")
    assert spaced.namespace == "nightly" and spaced.task_queue == "nightly.model"
    assert spaced.digest(b"") != plain.digest(b"")
    assert parse_spec({**base, "namespace": "n", "queue": "scoring"}).task_queue == "scoring"
    with pytest.raises(EvalSpecError, match="^--namespace: namespace: .*namespace 'a.b' must be"):
        plain.with_namespace("a.b")


def test_a_namespaced_task_s_queue_wait_is_labelled_with_its_own_queue() -> None:
    assert (queue_of("wesichain.think"), queue_of("wesichain.tool")) == ("wesichain.model", "wesichain.tools")
    assert queue_of("wesichain.think", "n") == "n.model" and queue_of("wesichain.tool", "n") == "n.tools"


def test_the_exporter_reports_the_depth_of_the_queues_live_workers_consume_besides_the_default() -> None:
    def live(*queues: str) -> LiveWorker:
        record = WorkerRecord(
            id="w@h",
            host="h",
            pid=1,
            queues=list(queues),
            pool="threads",
            concurrency=1,
            agents=[],
            started_at=0.0,
            consuming=True,
            consumer_state="consuming",
        )
        return LiveWorker(record=record, age_s=0.0)

    workers = [live("wesichain.model"), live(*namespace_queues("nightly")), live("nightly.model", "other")]
    assert PoolCollector._queues(workers) == [
        *QUEUES,
        "nightly.callbacks",
        "nightly.model",
        "nightly.tools",
        "other",
    ]
    many = [live(*(f"n{i}.model" for i in range(100)))]
    assert len(PoolCollector._queues(many)) == len(QUEUES) + MAX_EXTRA_QUEUES


def test_a_subagent_s_child_run_goes_to_its_parent_s_namespace() -> None:
    parent = _head(Phase.AWAITING_APPROVAL, "n")
    child = _child_head(parent, ChildRun(call_id="c1", run_id="r1:child", agent="b", input="go"))
    assert child.namespace == "n" and task_for(child)[0].queue == "n.model"
