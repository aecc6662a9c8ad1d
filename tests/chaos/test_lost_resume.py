"""A parent parked for its subagents whose resume message is lost before any worker takes it.

The last child's completion records its result and sends the parent's ``decide`` task. If the broker
loses that message (here: the worker's fault hook drops every ``wesichain.decide`` sent under epoch
0), nothing else would ever send it: the parent would wait for the broker's visibility timeout (an
hour) or for ever. The completion that records the step's last result marks the parent as owed its
resume, in the same script, so the sweeper finds the message missing from the broker once its queued
time is over and sends it again under a new epoch.
"""

from __future__ import annotations

import time

from producer.client import Client
from shared.state import Phase
from tests.chaos.support import Cluster, events_of, note_recovery, wait_terminal
from tests.harness import wait_until
from tests.invariants import assert_event_invariants

LOSE_THE_RESUME = {"WESICHAIN_FAULT": "lose:wesichain.decide"}


def test_a_parent_whose_resume_message_is_lost_is_resumed_by_the_sweeper(
    cluster: Cluster, client: Client
) -> None:
    cluster.start(2, env=LOSE_THE_RESUME, agents="tests.agents_capabilities")
    handle = client.submit("lead", "alpha; beta", check_agent=False)

    def children_ended() -> bool:
        return sum(e.kind == "ToolCompleted" for e in events_of(handle)) == 2

    wait_until(children_ended, 60, interval=0.05, what="both subagents' results recorded")
    ended = time.monotonic()
    head = wait_terminal(handle)
    note_recovery("subagents' parent, its resume message lost", time.monotonic() - ended)

    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "ok[found alpha] + ok[found beta]"
    # The resume was sent once under epoch 0 (lost) and once more by the sweeper's hand-on.
    assert head.epoch == 1
    events = events_of(handle)
    assert_event_invariants(events)
    assert [e.kind for e in events].count("ToolCompleted") == 2
