"""Context management by tokens: a 200-step run and a 100-run thread stay within their budget."""

from __future__ import annotations

import os
import signal
import uuid

from producer.client import Client
from shared.context import exchanges
from shared.messages import AssistantMessage, ToolMessage
from shared.state import Phase
from tests.agents_capabilities import (
    BUDGET,
    CONTEXT_MAX_KEY,
    CONTEXT_PROBLEMS_KEY,
    HANG_FIRST,
    MODEL_PIDS_KEY,
    SUMMARY_CALLS_KEY,
)
from tests.harness import WorkerProcess, wait_until

TIMEOUT = 240


def _problems(client: Client, tag: str) -> list[str]:
    problems = [str(p) for p in client.store.redis.lrange(CONTEXT_PROBLEMS_KEY, 0, -1)]
    return [p for p in problems if p.startswith(f"{tag}:")]


def test_a_200_step_run_never_sends_more_than_its_budget(client: Client) -> None:
    tag = uuid.uuid4().hex[:8]
    head = client.submit("long_run", "tick along", metadata={"tag": tag, "goal": 199}).wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "ticked 199 times" and head.step == 200
    assert _problems(client, tag) == []
    r = client.store.redis
    assert BUDGET.max_tokens * 0.8 < int(r.hget(CONTEXT_MAX_KEY, tag) or 0) <= BUDGET.max_tokens
    # The stored conversation is whole: trimming shaped the requests only.
    stored = client.store.load_messages(head.run_id)
    assert sum(1 for m in stored if isinstance(m, ToolMessage)) == 199
    assert all(len(u) == 2 for u in exchanges(stored[2:-1]) if isinstance(u[0], AssistantMessage))


def test_a_summary_is_written_once_per_cut_and_used(client: Client) -> None:
    tag = uuid.uuid4().hex[:8]
    client.store.redis.delete(SUMMARY_CALLS_KEY)
    head = client.submit("summarised", "tick along", metadata={"tag": tag, "goal": 40}).wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "ticked 40 times"
    assert _problems(client, tag) == []
    assert head.summary is not None and head.summary.text.startswith("summary of ")
    summaries = {h.summary.upto: h.summary for h in client.store.checkpoints(head.run_id) if h.summary}
    # Several cuts, each summarised once (one summary request each), each further than the last.
    calls = [int(c) for c in client.store.redis.hvals(SUMMARY_CALLS_KEY)]
    assert len(summaries) >= 2 and sum(calls) == len(summaries) and set(calls) == {1}
    assert head.summary.upto == max(summaries)


def test_a_worker_killed_while_summarising(client: Client, pool: list[WorkerProcess]) -> None:
    tag = uuid.uuid4().hex[:8]
    r = client.store.redis
    r.delete(SUMMARY_CALLS_KEY, MODEL_PIDS_KEY)
    handle = client.submit("summarised", f"{HANG_FIRST} tick along", metadata={"tag": tag, "goal": 30})
    pid = int(
        wait_until(lambda: r.hget(MODEL_PIDS_KEY, "summary"), TIMEOUT, what="the first summary request")
    )
    assert any(pid in w.children() for w in pool)
    os.kill(pid, signal.SIGKILL)
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert _problems(client, tag) == []
    summaries = {h.summary.upto: h.summary for h in client.store.checkpoints(head.run_id) if h.summary}
    calls = sorted(int(c) for c in r.hvals(SUMMARY_CALLS_KEY))
    # The killed request was asked again elsewhere; every summary was committed once.
    assert calls == [1] * (len(summaries) - 1) + [2]


def test_a_100_run_thread_stays_within_the_budget(client: Client) -> None:
    thread = f"t-{uuid.uuid4().hex[:8]}"
    for i in range(100):
        head = client.submit("chatty", f"q{i} {thread}", thread_id=thread).wait(TIMEOUT)
        assert head.phase is Phase.COMPLETED, head.error
    problems = [str(p) for p in client.store.redis.lrange(CONTEXT_PROBLEMS_KEY, 0, -1) if thread in str(p)]
    assert problems == []
    peaks = [int(client.store.redis.hget(CONTEXT_MAX_KEY, f"q{i} {thread}") or 0) for i in range(100)]
    assert max(peaks) <= BUDGET.max_tokens and peaks[-1] > BUDGET.max_tokens * 0.8
    # The last run started with the thread's history (more than fits), trimmed by tokens.
    assert len(client.store.load_messages(head.run_id)) > 20
