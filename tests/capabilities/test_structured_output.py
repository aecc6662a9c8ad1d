"""Structured output and prompt templates, end to end on a real redis-server and real workers.

The worker pool has short leases, so the kill test sees the think handed on within seconds.
"""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from producer.client import Client
from shared.errors import InvalidRequest
from shared.state import Phase
from tests.agents_capabilities import HANG_FIRST, MODEL_CALLS_KEY, MODEL_PIDS_KEY, Verdict
from tests.harness import WorkerProcess, wait_until

TIMEOUT = 60


def test_answer_is_validated_reprompted_and_stored_typed(client: Client) -> None:
    handle = client.submit("structured", "grade 2 + 5")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.output == {"title": "sum", "score": 7, "tags": ["total=7.0"]}
    verdict = head.output_as(Verdict)
    assert verdict == Verdict(title="sum", score=7, tags=["total=7.0"])
    # The out-of-range answer was reprompted once (charged to the budget), then accepted.
    assert head.reprompts == 1
    events = list(handle.events(follow=False))
    failed = [e for e in events if e.kind == "StepFailed"]
    assert len(failed) == 1 and failed[0].decision == "reprompt"
    assert "less than or equal to 10" in failed[0].error.message
    completed = events[-1]
    assert completed.kind == "Completed" and completed.output == head.output


def test_answer_never_valid_fails_the_run_with_a_structured_error(client: Client) -> None:
    head = client.submit("structured_strict", "grade this").wait(TIMEOUT)
    assert head.phase is Phase.FAILED
    assert head.error is not None and head.error.kind == "InvalidModelAction"
    assert "does not match the output type Verdict: it is not a JSON object" in head.error.message
    assert head.output is None


def test_think_killed_mid_call_is_handed_on_and_validated_once(
    client: Client, pool: list[WorkerProcess]
) -> None:
    text = HANG_FIRST + "grade 2 + 5"
    handle = client.submit("structured", text)
    r = client.store.redis
    pid = int(wait_until(lambda: r.hget(MODEL_PIDS_KEY, text), TIMEOUT, what="the first model call"))
    assert any(pid in w.children() for w in pool)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", 10)
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.output_as(Verdict) == Verdict(title="sum", score=7, tags=["total=7.0"])
    # The killed call was made again elsewhere; every later turn exactly once.
    assert r.hget(MODEL_CALLS_KEY, f"{text}:0") == "2"
    assert r.hget(MODEL_CALLS_KEY, f"{text}:1") == "1"
    assert r.hget(MODEL_CALLS_KEY, f"{text}:2") == "1"
    assert head.reprompts == 1


def test_templates_are_filled_from_input_and_metadata(client: Client) -> None:
    head = client.submit(
        "templated", "what is a lease?", metadata={"language": "French", "audience": "operators"}
    ).wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED
    assert head.answer == (
        "system='You answer in French, for operators.' user='Question (operators): what is a lease?'"
    )


def test_a_missing_variable_is_refused_at_submit(client: Client) -> None:
    with pytest.raises(InvalidRequest, match=r"metadata 'audience', 'language'"):
        client.submit("templated", "what is a lease?")
    with pytest.raises(InvalidRequest, match=r"metadata 'audience'"):
        client.submit("templated", "what is a lease?", metadata={"language": "French"})


def test_a_missing_variable_unchecked_fails_the_run_not_the_worker(client: Client) -> None:
    head = client.submit("templated", "what is a lease?", check_agent=False).wait(TIMEOUT)
    assert head.phase is Phase.FAILED
    assert head.error is not None and head.error.kind == "InvalidRequest"
    assert "'audience', 'language'" in head.error.message
