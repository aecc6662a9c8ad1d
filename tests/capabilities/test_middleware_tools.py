"""Middleware and the richer tools, end to end on a real redis-server and real workers."""

from __future__ import annotations

import json
import os
import signal

import pytest

from producer.client import Client
from shared.messages import ToolMessage
from shared.state import Phase
from tests.agents_capabilities import (
    AUDIT_KEY,
    HANG_FIRST,
    MODEL_CALLS_KEY,
    MODEL_PIDS_KEY,
    RUNNING_KEY,
    Verdict,
)
from tests.agents_fixture import EFFECTS_KEY
from tests.harness import WorkerProcess, wait_until

TIMEOUT = 60
REFUSED = (
    "Error: the call was refused by BlockArguments:"
    " argument 'url' of 'fetch': internal addresses are off limits"
)
REDACTED = "Customer 7: [redacted email], [redacted phone], card [redacted card]"


def _audit(client: Client, run_id: str) -> list[dict[str, object]]:
    entries = [json.loads(e) for e in client.store.redis.lrange(AUDIT_KEY, 0, -1)]
    return [e for e in entries if e["run_id"] == run_id]


def _check_guarded_run(client: Client, run_id: str) -> None:
    head = client.handle(run_id).wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == f"{REDACTED} | {REFUSED} | fetched https://example.org/"
    # The model, the stored conversation and the events saw only redacted results.
    tool_messages = [m for m in client.store.load_messages(run_id) if isinstance(m, ToolMessage)]
    assert [m.content for m in tool_messages] == [REDACTED, REFUSED, "fetched https://example.org/"]
    events = list(client.handle(run_id).events(follow=False))
    outputs = [e.output for e in events if e.kind == "ToolCompleted"]
    assert sorted(outputs) == sorted([REDACTED, REFUSED, "fetched https://example.org/"])
    assert "jane.doe" not in json.dumps([e.model_dump() for e in events])
    # The refused call never ran; the allowed one ran once.
    r = client.store.redis
    assert r.hget(EFFECTS_KEY, f"{run_id}:1:call_1") is None
    assert r.hget(EFFECTS_KEY, f"{run_id}:1:call_2") == "1"
    # The shouted answer was vetoed, the model told why, and its next answer accepted.
    (vetoed,) = [e for e in events if e.kind == "StepFailed"]
    assert vetoed.decision == "reprompt"
    assert vetoed.error.message == (
        "the reply was vetoed by NoShouting: do not shout; answer in sentence case"
    )
    # The audit log: every tool call with its arguments, every completed model call.
    audit = _audit(client, run_id)
    tools = sorted(
        (e["tool"], e["ok"], json.dumps(e["arguments"])) for e in audit if e["kind"] == "tool_call"
    )
    assert tools == [
        ("fetch", False, '{"url": "http://internal.example/admin"}'),
        ("fetch", True, '{"url": "https://example.org/"}'),
        ("lookup_customer", True, '{"id": 7}'),
    ]
    assert [e["step"] for e in audit if e["kind"] == "model_call"] == [1, 2, 3]


def test_middleware_redacts_blocks_vetoes_and_audits(client: Client) -> None:
    handle = client.submit("guarded", "  look customer 7 up  ")
    _check_guarded_run(client, handle.run_id)
    # on_user_message rewrote the input (stripped) before it was stored.
    first_user = client.store.load_messages(handle.run_id)[1]
    assert first_user.content == "look customer 7 up"


def test_middleware_refuses_an_input(client: Client) -> None:
    head = client.submit("guarded", "please DROP TABLE customers").wait(TIMEOUT)
    assert head.phase is Phase.FAILED
    assert head.error is not None and head.error.kind == "InvalidRequest"
    assert head.error.message == "the input was refused by NoShouting: the input looks like SQL"
    assert client.store.redis.hget(MODEL_CALLS_KEY, "please DROP TABLE customers:0") is None


def test_middleware_decisions_survive_a_worker_killed_mid_think(
    client: Client, pool: list[WorkerProcess]
) -> None:
    text = HANG_FIRST + "look customer 7 up"
    handle = client.submit("guarded", text)
    r = client.store.redis
    pid = int(wait_until(lambda: r.hget(MODEL_PIDS_KEY, text), TIMEOUT, what="the first model call"))
    assert any(pid in w.children() for w in pool)
    os.kill(pid, signal.SIGKILL)
    _check_guarded_run(client, handle.run_id)
    assert r.hget(MODEL_CALLS_KEY, f"{text}:0") == "2"  # the killed call, then its hand-over


@pytest.mark.parametrize(("failures", "ok"), [(2, True), (9, False)])
def test_a_retry_safe_tool_is_retried_within_its_bound(client: Client, failures: int, ok: bool) -> None:
    handle = client.submit("retrying", f"fail {failures}")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    attempts = client.store.redis.hget("test:flaky", f"{handle.run_id}:1:call_0")
    (completed,) = [e for e in handle.events(follow=False) if e.kind == "ToolCompleted"]
    if ok:
        assert attempts == "3"
        assert head.answer == "tool said: succeeded on attempt 3"
        assert completed.ok
    else:
        assert attempts == "4"  # the first attempt and Retry(n=3)
        assert head.answer == "tool said: Error: ConnectionError: attempt 4 failed"
        assert completed.error is not None and completed.error.details["attempts"] == 4


def test_a_tool_can_end_the_run_with_its_result(client: Client) -> None:
    handle = client.submit("ending", "grade it")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.output_as(Verdict) == Verdict(title="done", score=9, tags=["by tool"])
    assert json.loads(head.answer or "") == head.output
    assert client.store.redis.hget(MODEL_CALLS_KEY, "grade it:1") is None  # not asked again
    assert head.step == 1


def test_approval_by_argument_by_risk_and_always_for_this_run(client: Client) -> None:
    handle = client.submit("transfers", "pay")
    r = client.store.redis
    # 500 cents needs no approval; 50 000 does (the tool's predicate).
    wait_until(lambda: handle.status().phase is Phase.AWAITING_APPROVAL, TIMEOUT, what="the large transfer")
    parked = handle.status()
    assert parked.step == 2 and parked.pending_calls[0].arguments == {"cents": 50_000}
    assert r.hget(EFFECTS_KEY, f"{handle.run_id}:1:call_0") == "1"
    handle.approve("fine", always=True)
    # 60 000 goes through (transfer is approved for the run); wipe is high risk: parks again.
    wait_until(
        lambda: (h := handle.status()).phase is Phase.AWAITING_APPROVAL and h.step == 4,
        TIMEOUT,
        what="the high-risk call",
    )
    parked = handle.status()
    assert parked.pending_calls[0].name == "wipe" and parked.approved_tools == ["transfer"]
    assert r.hget(EFFECTS_KEY, f"{handle.run_id}:3:call_0") == "1"
    handle.approve()
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    # The approval's note reached the model with the approved call's result (and only that one).
    assert head.answer == "moved 500, moved 50000\n\n[Approved by a human reviewer: fine], moved 60000, wiped"


@pytest.mark.parametrize(("agent", "cap"), [("capped", 2), ("sequential", 1)])
def test_parallel_calls_of_a_step_are_capped(client: Client, agent: str, cap: int) -> None:
    handle = client.submit(agent, "fan out")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "g0,g1,g2,g3,g4"  # every result, in call order
    assert head.step == 2 and not head.done_calls and not head.waiting_calls
    r = client.store.redis
    peaks = {int(p) for p in r.smembers(f"{RUNNING_KEY}:peaks:{handle.run_id}")}
    assert max(peaks) <= cap
    assert [r.hget(EFFECTS_KEY, f"{handle.run_id}:1:call_{i}") for i in range(5)] == ["1"] * 5
    events = list(handle.events(follow=False))
    assert [e.call_id for e in events if e.kind == "ToolDispatched"] == [f"call_{i}" for i in range(5)]
    waves = [h for h in client.store.checkpoints(handle.run_id) if h.phase is Phase.ACTING]
    assert [len(w.pending_calls) for w in waves] == [min(cap, 5 - i) for i in range(0, 5, cap)]
