"""A tool cannot outlive its timeout.

The soft limit is an exception the tool cannot catch by accident (a ``BaseException``); a tool
that ignores it anyway, or sits in C code where no exception can reach it, is killed by Celery's
hard time limit, derived from its timeout, and its call is recorded as timed out (outcome unknown
for a non-retry-safe tool). Its pool slot comes back and the run goes on, or ends on a cancel.
"""

from __future__ import annotations

import pytest

from producer.client import Client
from shared.state import Phase
from tests.chaos.support import (
    RUN_TIMEOUT_S,
    Cluster,
    assert_event_invariants,
    assert_terminal_matches_events,
    effects,
    events_of,
    idem,
    starts,
    wait_tool_started,
)
from tests.invariants import ONE_HOP


@pytest.mark.parametrize("agent", ["swallowing", "hanging"])
def test_a_tool_past_its_timeout_is_stopped_and_the_run_goes_on(
    cluster: Cluster, client: Client, agent: str
) -> None:
    (worker,) = cluster.start(1, concurrency=1)
    r = client.store.redis
    handle = client.submit(agent, "go")
    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.COMPLETED and head.answer == "went on without the tool", (
        f"{head.phase} {head.error}"
    )
    assert [e.kind for e in events if e.kind != "TokenDelta"] == ONE_HOP
    (done,) = [e for e in events if e.kind == "ToolCompleted"]
    assert not done.ok and done.error is not None and done.error.kind == "ToolDispatch"
    assert "timeout" in done.error.message
    key = idem(handle.run_id)
    assert starts(r, key) == 1 and effects(r, key) == 0, "the tool ran on (or again) after its timeout"
    assert_event_invariants(events)
    # Its single pool slot is free again: the worker serves the next run.
    assert client.submit("one_hop", "go").wait(RUN_TIMEOUT_S).phase is Phase.COMPLETED
    assert worker.alive


def test_a_non_retry_safe_tool_past_its_timeout_is_outcome_unknown(cluster: Cluster, client: Client) -> None:
    cluster.start(1, concurrency=1)
    r = client.store.redis
    handle = client.submit("charge_hanging", "go")
    head = handle.wait(RUN_TIMEOUT_S)
    assert head.phase is Phase.FAILED and head.error is not None, head.phase
    assert head.error.kind == "ToolOutcomeUnknown" and head.error.tool == "charge_hang_in_c"
    assert_terminal_matches_events(head, events_of(handle))
    assert starts(r, idem(handle.run_id)) == 1


def test_cancel_ends_a_run_whose_tool_hangs(cluster: Cluster, client: Client) -> None:
    cluster.start(1, concurrency=1, env={"WESICHAIN_LEASE_S": "2"})
    r = client.store.redis
    handle = client.submit("hanging", "go")
    wait_tool_started(r, idem(handle.run_id))
    handle.cancel()
    head = handle.wait(RUN_TIMEOUT_S)
    assert head.phase is Phase.INTERRUPTED, f"{head.phase} {head.error}"
    assert_terminal_matches_events(head, events_of(handle))
