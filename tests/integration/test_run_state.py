"""An agent's custom run state on real workers: read and updated by its tools, validated on every
write, checkpointed with every commit, visible in the run's status, and set at submit."""

from __future__ import annotations

from producer.client import Client
from shared.state import Phase
from tests.agents_fixture import Notebook
from tests.harness import WorkerProcess

TIMEOUT = 30


def test_tools_update_the_state_step_by_step(workers: list[WorkerProcess], client: Client) -> None:
    handle = client.submit("notebook", "go")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED and head.answer == "three notes"
    # Step 1 noted "first"; step 2's two calls both saw that state and their changes applied in
    # call order, field by field (the later call's value of a field wins); step 3's change broke
    # the state's rule (count >= 0), so that call failed and changed nothing.
    assert head.state_as(Notebook) == Notebook(notes=["first", "b"], count=2)
    results = {r.call_id: r for r in client.store.load_results(handle.run_id, 3)}
    (refused,) = results.values()
    assert not refused.ok and refused.error is not None and "state update refused" in refused.error.message
    assert refused.state_update is None

    # Every commit carries the state as it was then: the observes of steps 1 and 2 moved it.
    states = [(c.version, c.phase.value, c.state) for c in client.store.checkpoints(handle.run_id)]
    assert states[0][2] is None  # as the producer created it (no state given)
    moves: list[dict[str, object] | None] = []
    for _, _, state in states[1:]:
        if not moves or moves[-1] != state:
            moves.append(state)
    assert moves == [
        {"notes": [], "count": 0},
        {"notes": ["first"], "count": 1},
        {"notes": ["first", "b"], "count": 2},
    ]


def test_a_run_starts_from_the_state_it_was_given(workers: list[WorkerProcess], client: Client) -> None:
    handle = client.submit("notebook", "go", state={"notes": ["given"], "count": 10})
    head = handle.wait(TIMEOUT)
    assert head.state_as(Notebook) == Notebook(notes=["given", "first", "b"], count=12)


def test_a_state_that_does_not_fit_fails_the_run_at_its_start(
    workers: list[WorkerProcess], client: Client
) -> None:
    handle = client.submit("notebook", "go", state={"count": "many"})
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.FAILED and head.error is not None
    assert head.error.kind == "InvalidRequest" and "does not fit Notebook" in head.error.message
    stateless = client.submit("direct", "go", state={"count": 1}).wait(TIMEOUT)
    assert stateless.phase is Phase.FAILED and stateless.error is not None
    assert "declares no state_type" in stateless.error.message
