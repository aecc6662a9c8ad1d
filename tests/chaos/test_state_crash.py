"""A worker dies while a run's custom state is being changed; the state still moves exactly once.

A tool's state change travels in its result (written once per call) and is applied by the observe
that follows, in the same commit as the rest of the step. So a tool re-run after a crash, an
observe re-run after a crash, or an observe whose commit survived its process must all leave the
state exactly as a run without crashes leaves it: never a change lost, never one applied twice.
"""

from __future__ import annotations

import pytest

from producer.client import Client
from shared.state import Phase
from tests.agents_fixture import Notebook
from tests.chaos.faults import fired_key
from tests.chaos.support import Cluster, wait_paused, wait_terminal

#: The state after each observe of the ``notebook`` agent, as a run without crashes commits it
#: (tests/integration/test_run_state.py): step 2's two calls both start from step 1's state.
MOVES = [
    {"notes": [], "count": 0},
    {"notes": ["first"], "count": 1},
    {"notes": ["first", "b"], "count": 2},
]


def _moves(client: Client, run_id: str) -> list[object]:
    moves: list[object] = []
    for checkpoint in client.store.checkpoints(run_id)[1:]:
        if not moves or moves[-1] != checkpoint.state:
            moves.append(checkpoint.state)
    return moves


@pytest.mark.parametrize("phase", [Phase.ACTING, Phase.OBSERVING], ids=str)
def test_whole_worker_killed_while_the_state_changes(cluster: Cluster, client: Client, phase: Phase) -> None:
    # Acting: the first `note` call is running; it runs again on the other worker.
    # Observing: the tool's change is in its result, not yet applied; the observe runs again.
    cluster.start(2, env={"WESICHAIN_FAULT": f"pause:{phase.value}"})
    handle = client.submit("notebook", "go")
    victim = cluster.owner(wait_paused(client.store.redis, phase, handle.run_id))
    dead = victim.pids()
    victim.kill()

    head = wait_terminal(handle)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.state_as(Notebook) == Notebook(notes=["first", "b"], count=2)
    assert _moves(client, handle.run_id) == MOVES
    # The timeline shows the one takeover, by a process that was not killed.
    takeovers = [m for m in handle.timeline().markers if m.kind == "takeover"]
    assert len(takeovers) == 1, takeovers
    assert takeovers[0].lane is not None and not any(str(pid) in takeovers[0].lane for pid in dead)


def test_process_dies_after_the_observe_that_applied_the_state_committed(
    cluster: Cluster, client: Client
) -> None:
    # The commit that moved the state survived; only the publish of the next think was lost. The
    # sweeper publishes it again, and nothing applies the change a second time.
    cluster.start(2, env={"WESICHAIN_FAULT": "crash_after_commit:observing"})
    handle = client.submit("notebook", "go")
    head = wait_terminal(handle)
    assert head.phase is Phase.COMPLETED, head.error
    assert client.store.redis.get(fired_key("crash_after_commit:observing", handle.run_id)) is not None
    assert head.state_as(Notebook) == Notebook(notes=["first", "b"], count=2)
    assert _moves(client, handle.run_id) == MOVES
