"""A worker is SIGKILLed around the commit that applies a run's pending signals; each signal is
still applied exactly once: every message once in the conversation, in order, the state update
merged once, one ``SignalApplied`` per signal.

The signals are sent before any worker runs (the run waits IDLE), so the think that applies them is
the run's first, whatever the machine's speed: no test waits on a timer to get its kill in.
"""

from __future__ import annotations

from producer.client import Client, RunHandle
from shared.messages import UserMessage
from shared.state import Phase
from tests.agents_fixture import HOLDING_KEY, RELEASE_KEY, Inbox
from tests.chaos.faults import fired_key
from tests.chaos.support import Cluster, events_of, wait_paused, wait_terminal
from tests.harness import wait_until

MESSAGES = ("first", "second", "third")


def _queue_signals(client: Client) -> RunHandle:
    handle = client.submit("inbox", "go", check_agent=False)
    for text in MESSAGES:
        handle.send_message(text)
    handle.update({"priority": 5, "tags": ["a"]}, wait=None)
    return handle


def _finish(client: Client, handle: RunHandle) -> None:
    wait_until(lambda: client.store.redis.exists(HOLDING_KEY + handle.run_id), 60, what="the hold call")
    client.store.redis.set(RELEASE_KEY + handle.run_id, "1", ex=3600)


def _assert_applied_once(client: Client, handle: RunHandle) -> None:
    head = wait_terminal(handle)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "heard: first | second | third"
    users = [m.content for m in client.store.load_messages(handle.run_id) if isinstance(m, UserMessage)]
    assert users == ["go", *MESSAGES]
    assert head.state_as(Inbox) == Inbox(priority=5, tags=["a"])
    assert head.signals_applied == 4
    applied = [(e.seq, e.accepted) for e in events_of(handle) if e.kind == "SignalApplied"]
    assert applied == [(1, True), (2, True), (3, True), (4, True)]
    assert [handle.signal(seq).status for seq in (1, 2, 3, 4)] == ["accepted"] * 4
    # Exactly one commit moved the cursor (and the state) past the signals.
    cursors = [c.signals_applied for c in client.store.checkpoints(handle.run_id)]
    assert sorted(set(cursors)) == [0, 4] and cursors == sorted(cursors)


def test_worker_killed_in_the_think_that_applies_signals(cluster: Cluster, client: Client) -> None:
    # The think has claimed the run with the signals pending and has not committed: the whole
    # worker is SIGKILLed, the other takes the think over and applies them.
    handle = _queue_signals(client)
    cluster.start(2, env={"WESICHAIN_FAULT": "pause:thinking", "WESICHAIN_FAULT_PAUSE_S": "600"})
    victim = cluster.owner(wait_paused(client.store.redis, Phase.THINKING, handle.run_id))
    victim.kill()
    _finish(client, handle)
    _assert_applied_once(client, handle)
    assert victim.alive is False


def test_process_killed_right_after_the_commit_that_applied_signals(cluster: Cluster, client: Client) -> None:
    # The commit applying the signals survived its process (SIGKILLed before it published the next
    # think): the next think must find them applied, and apply nothing again.
    handle = _queue_signals(client)
    cluster.start(2, env={"WESICHAIN_FAULT": "crash_after_commit:thinking"})
    _finish(client, handle)
    _assert_applied_once(client, handle)
    assert client.store.redis.get(fired_key("crash_after_commit:thinking", handle.run_id)) is not None
