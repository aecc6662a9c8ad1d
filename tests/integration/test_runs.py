"""End-to-end runs on a real redis-server with real `wesichain worker` processes."""

from __future__ import annotations

import pytest

from producer.client import Client, RunHandle
from shared.errors import InvalidRequest
from shared.events import Event
from shared.state import Phase
from tests.agents_fixture import EFFECTS_KEY
from tests.harness import WorkerProcess, wait_until
from tests.invariants import ONE_HOP, assert_event_invariants, kinds

TIMEOUT = 30


def run(client: Client, agent: str, text: str = "go") -> tuple[RunHandle, list[Event]]:
    handle = client.submit(agent, text)
    events = list(handle.events())
    return handle, events


def test_direct_answer(workers: list[WorkerProcess], client: Client) -> None:
    handle, events = run(client, "direct")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED
    assert head.answer == "The answer is 42."
    assert kinds(events) == ["RunStarted", "StepStarted", "ModelResponded", "Completed"]
    assert head.step == 1 and head.agent_version == "1" and head.model == "scripted:direct"
    assert_event_invariants(events)


def test_one_tool_hop(workers: list[WorkerProcess], client: Client) -> None:
    handle, events = run(client, "one_hop")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED and head.answer == "1 + 2 = 3"
    assert kinds(events) == ONE_HOP
    done = next(e for e in events if e.kind == "ToolCompleted")
    assert done.ok and done.output == "3.0"
    messages = client.store.load_messages(handle.run_id)
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert client.store.redis.hget(EFFECTS_KEY, f"{handle.run_id}:1:call_0") == "1"
    assert_event_invariants(events)


def test_multi_hop_chain(workers: list[WorkerProcess], client: Client) -> None:
    handle, events = run(client, "chain")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED and head.answer == "done after three hops"
    assert head.step == 4
    outputs = [e.output for e in events if e.kind == "ToolCompleted"]
    assert outputs == ["3.0", "7.0", "11.0"]
    # Every transition was its own committed checkpoint: start, 3 x (think, fan-in, observe), final think.
    versions = [c.version for c in client.store.checkpoints(handle.run_id)]
    assert versions == sorted(versions) and versions[0] == 1
    assert_event_invariants(events)


def test_parallel_tool_calls_fan_out_across_processes(workers: list[WorkerProcess], client: Client) -> None:
    handle, events = run(client, "parallel")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED and head.answer == "all four done"
    completed = [e for e in events if e.kind == "ToolCompleted"]
    assert sorted(e.call_id for e in completed) == ["call_0", "call_1", "call_2", "call_3"]
    processes = {(e.worker.host, e.worker.pid) for e in completed}
    assert len(processes) >= 2, f"all tool calls ran in one process: {processes}"
    worker_pids = set().union(*(w.pids() for w in workers))
    assert {pid for _, pid in processes} <= worker_pids
    assert_event_invariants(events)


@pytest.mark.parametrize(
    ("agent", "fragment"),
    [
        ("unknown_tool", "unknown tool 'does_not_exist'"),
        ("bad_json", "not valid JSON"),
        ("bad_args", "failed validation"),
    ],
)
def test_malformed_model_action_fails_with_structured_error(
    workers: list[WorkerProcess], client: Client, agent: str, fragment: str
) -> None:
    handle, events = run(client, agent)
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.FAILED
    assert head.error is not None and head.error.kind == "InvalidModelAction"
    assert fragment in head.error.message
    assert head.error.step == 1
    assert head.error.details.get("args") is not None
    failed = [e for e in events if e.kind == "Failed"]
    assert len(failed) == 1 and failed[0].error == head.error
    step_failed = [e for e in events if e.kind == "StepFailed"]
    assert len(step_failed) == 1 and step_failed[0].decision == "fail"
    assert not [e for e in events if e.kind == "ToolDispatched"]


def test_invalid_action_reprompt_policy_recovers(workers: list[WorkerProcess], client: Client) -> None:
    handle, events = run(client, "reprompt")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED and head.answer == "fixed it: 2"
    assert head.reprompts == 1
    decisions = [e.decision for e in events if e.kind == "StepFailed"]
    assert decisions == ["reprompt"]
    assert_event_invariants(events)


def test_invalid_action_interrupt_policy(workers: list[WorkerProcess], client: Client) -> None:
    handle, _ = run(client, "interrupt_on_invalid")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.INTERRUPTED
    assert head.error is not None and head.error.kind == "InvalidModelAction"


def test_tool_error_policies(workers: list[WorkerProcess], client: Client) -> None:
    cont, events = run(client, "tool_error_continue")
    head = cont.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED and head.answer == "recovered from the tool error"
    failed_call = next(e for e in events if e.kind == "ToolCompleted")
    assert not failed_call.ok and failed_call.error is not None and failed_call.error.kind == "ToolDispatch"
    assert "boom: the tool failed" in failed_call.output

    fast, _ = run(client, "tool_error_fail")
    head = fast.wait(TIMEOUT)
    assert head.phase is Phase.FAILED
    assert head.error is not None and head.error.kind == "ToolDispatch" and head.error.tool == "boom"


def test_step_budget_is_enforced(workers: list[WorkerProcess], client: Client) -> None:
    handle, _ = run(client, "budget")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.FAILED
    assert head.error is not None and head.error.kind == "BudgetExceeded"
    assert head.steps_used == 2


def test_model_transport_error_retried_then_failed(workers: list[WorkerProcess], client: Client) -> None:
    handle, events = run(client, "model_retry_fail")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.FAILED
    assert head.error is not None and head.error.kind == "ModelTransport"
    assert [e.decision for e in events if e.kind == "StepFailed"] == ["retry", "retry", "fail"]


def test_cancel_during_a_run(workers: list[WorkerProcess], client: Client) -> None:
    handle = client.submit("long_tool", "go")
    wait_until(
        lambda: any(e.kind == "ToolDispatched" for e in handle.events(follow=False)), TIMEOUT, what="dispatch"
    )
    assert handle.cancel() in (Phase.ACTING, Phase.THINKING)
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.INTERRUPTED
    events = list(handle.events(follow=False))
    assert kinds(events)[-1] == "Interrupted"
    assert_event_invariants(events)


def test_unknown_agent_is_refused_or_fails_cleanly(workers: list[WorkerProcess], client: Client) -> None:
    with pytest.raises(InvalidRequest, match="no live worker serves agent 'no_such_agent'"):
        client.submit("no_such_agent", "hello")
    handle = client.submit("no_such_agent", "hello", check_agent=False)
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.FAILED
    assert head.error is not None and head.error.kind == "Config" and "no_such_agent" in head.error.message


def test_duplicate_deliveries_change_nothing(workers: list[WorkerProcess], client: Client) -> None:
    handle, events = run(client, "one_hop")
    head = handle.wait(TIMEOUT)
    before = (
        head.version,
        len(client.store.load_messages(handle.run_id)),
        len(list(handle.events(follow=False))),
    )
    run_id = handle.run_id
    # Re-deliver every phase message the run ever saw, twice each.
    replay = [
        ("wesichain.start", {"run_id": run_id, "version": 1}),
        ("wesichain.think", {"run_id": run_id, "step": 1, "version": 2}),
        ("wesichain.tool", {"run_id": run_id, "step": 1, "version": 3, "call_id": "call_0"}),
        ("wesichain.observe", {"run_id": run_id, "step": 1, "version": 4}),
        ("wesichain.think", {"run_id": run_id, "step": 2, "version": 5}),
    ]
    for name, kwargs in replay * 2:
        client.app.send_task(name, kwargs=kwargs)
    # A marker run submitted after the replays finishes only once the queue drained past them.
    marker, _ = run(client, "direct")
    marker.wait(TIMEOUT)
    wait_until(lambda: _queues_empty(client), TIMEOUT, what="queues to drain")
    after_head = handle.status()
    after = (
        after_head.version,
        len(client.store.load_messages(run_id)),
        len(list(handle.events(follow=False))),
    )
    assert after == before
    assert after_head.model_dump(exclude={"updated_at"}) == head.model_dump(exclude={"updated_at"})
    assert client.store.redis.hget(EFFECTS_KEY, f"{run_id}:1:call_0") == "1"


def _queues_empty(client: Client) -> bool:
    r = client.store.redis
    prefix = client.settings.prefix + "celery:"
    lengths = [r.llen(prefix + q) for q in ("wesichain.model", "wesichain.tools")]
    return sum(lengths) == 0 and r.hlen(prefix + "unacked") == 0
