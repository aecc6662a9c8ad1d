"""Subagents: child runs on the pool, the parent parked without a worker, crashes in both."""

from __future__ import annotations

import os
import signal

from producer.client import Client
from shared.state import ParentLink, Phase
from shared.subagents import child_run_id
from tests.agents_capabilities import HANG_FIRST, MODEL_CALLS_KEY, MODEL_PIDS_KEY
from tests.agents_fixture import EFFECTS_KEY
from tests.harness import WorkerProcess, wait_until

TIMEOUT = 60


def _check_children(client: Client, parent_id: str, tasks: list[str]) -> None:
    r = client.store.redis
    for i, task in enumerate(tasks):
        child_id = child_run_id(parent_id, 1, f"call_{i}")
        child = client.store.load(child_id)
        assert child is not None and child.phase is Phase.COMPLETED, child
        assert child.parent == ParentLink(run_id=parent_id, step=1, call_id=f"call_{i}", depth=1)
        assert child.answer == f"found {task}"
        assert r.hget(EFFECTS_KEY, f"{child_id}:1:call_0") == "1"  # its tool ran once
        assert r.hget(MODEL_CALLS_KEY, f"{child.input}:1") == "1"  # its last think ran once


def test_children_run_in_parallel_and_their_answers_are_the_tool_results(client: Client) -> None:
    handle = client.submit("lead", "alpha; beta")
    wait_until(lambda: handle.status().phase is Phase.AWAITING_APPROVAL, TIMEOUT, what="the parent to park")
    parked = handle.status()
    assert parked.approval is not None and parked.approval.kind == "children"
    # Parked: no lease, so no worker and no sweeper holds it while the children run.
    assert client.store.redis.zscore(client.store.keys.leases_of(handle.run_id), handle.run_id) is None
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "ok[found alpha] + ok[found beta]"
    assert head.children == 2
    _check_children(client, handle.run_id, ["alpha", "beta"])
    events = list(handle.events(follow=False))
    dispatched = [e.child_run_id for e in events if e.kind == "ToolDispatched"]
    completed = [e.child_run_id for e in events if e.kind == "ToolCompleted"]
    children = [child_run_id(handle.run_id, 1, f"call_{i}") for i in range(2)]
    assert dispatched == children and sorted(completed) == children  # type: ignore[type-var]


def test_a_structured_child_answers_with_its_output(client: Client) -> None:
    head = client.submit("lead", "grade essay").wait(TIMEOUT)
    assert head.answer == 'ok[{"title": "essay", "score": 5, "tags": []}]'


def test_a_worker_killed_in_the_parents_think(client: Client, pool: list[WorkerProcess]) -> None:
    text = HANG_FIRST + "gamma; delta"
    handle = client.submit("lead", text)
    r = client.store.redis
    pid = int(wait_until(lambda: r.hget(MODEL_PIDS_KEY, text), TIMEOUT, what="the parent's first think"))
    assert any(pid in w.children() for w in pool)
    os.kill(pid, signal.SIGKILL)
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "ok[found gamma] + ok[found delta]"
    assert r.hget(MODEL_CALLS_KEY, f"{text}:0") == "2"
    _check_children(client, handle.run_id, ["gamma", "delta"])


def test_a_worker_killed_in_a_childs_think(client: Client, pool: list[WorkerProcess]) -> None:
    handle = client.submit("lead", f"zeta; {HANG_FIRST}epsilon")
    r = client.store.redis
    # The second child's input starts with hang: its first think never returns until killed.
    child_input = f"{HANG_FIRST}epsilon"
    pid = int(wait_until(lambda: r.hget(MODEL_PIDS_KEY, child_input), TIMEOUT, what="the child's think"))
    assert any(pid in w.children() for w in pool)
    os.kill(pid, signal.SIGKILL)
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "ok[found zeta] + ok[found epsilon]"
    assert r.hget(MODEL_CALLS_KEY, f"{child_input}:0") == "2"  # killed, then handed on
    _check_children(client, handle.run_id, ["zeta", "epsilon"])


def test_cancelling_the_parent_cancels_its_children(client: Client) -> None:
    handle = client.submit("lead", "do it slowly; also slowly")
    children = [child_run_id(handle.run_id, 1, f"call_{i}") for i in range(2)]

    def children_acting() -> bool:
        heads = [client.store.load(c) for c in children]
        return all(h is not None and h.phase is Phase.ACTING for h in heads)

    wait_until(children_acting, TIMEOUT, what="both children to run their slow tool")
    assert handle.cancel() is Phase.AWAITING_APPROVAL
    assert handle.wait(TIMEOUT).phase is Phase.INTERRUPTED
    for child in children:
        assert client.handle(child).wait(TIMEOUT).phase is Phase.INTERRUPTED


def test_depth_limit(client: Client) -> None:
    head = client.submit("recursive", "start").wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "up(up(leaf))"
    deepest = client.store.load(child_run_id(child_run_id(head.run_id, 1, "call_0"), 1, "call_0"))
    assert deepest is not None and deepest.parent is not None and deepest.parent.depth == 2
    assert deepest.reprompts == 1 and deepest.children == 0


def test_total_children_limit(client: Client) -> None:
    head = client.submit("greedy", "go").wait(TIMEOUT)
    assert head.phase is Phase.FAILED
    assert head.error is not None and head.error.kind == "InvalidModelAction"
    assert "started 0 of its 2 subagent runs; 3 more would pass the limit" in head.error.message
    assert client.store.load(child_run_id(head.run_id, 1, "call_0")) is None
