"""A step's bookkeeping scripts on the in-process Redis stand-in: what a recorded item says about
starting more, the run's status seen by the noting of a child, and the step's pump lease that ends
close together share."""

from __future__ import annotations

import random
from typing import Any

import fakeredis
import pytest

from shared.keys import Keys
from shared.pipeline.store import ItemToStart, PipelineStore, PumpLease, Recorded, child_run_id


def step_of(items: int, cap: int) -> PipelineStore:
    s = PipelineStore(fakeredis.FakeRedis(decode_responses=True), Keys(prefix="t:"), retention_s=3600)
    assert s.create("p", "chain", "in", None)
    assert s.advance("p", -1, "chain", 0, "map", cap, {"name": "m"}, [f"item {i}" for i in range(items)])
    return s


def record(s: PipelineStore, item: int) -> str:
    result = {"run_id": child_run_id("p", 0, item, 0), "status": "completed"}
    return s.record("p", 0, item, 0, result, {"kind": "child_ended", "item": item}).answer


def test_a_recorded_item_says_whether_items_wait_to_start_in_the_room_it_gave_back() -> None:
    s = step_of(items=3, cap=2)
    assert s.reserve("p", 0, 50) == [(0, 0, "item 0"), (1, 0, "item 1")]
    assert record(s, 0) == "recorded"  # item 2 waits: a pump takes the room
    assert s.reserve("p", 0, 50) == [(2, 0, "item 2")]
    assert record(s, 1) == "waiting"  # every item is started: there is nothing to pump
    assert record(s, 1) == "dup"
    assert record(s, 2) == "complete"


def mark_child(
    s: PipelineStore, pipeline_id: str, seq: int, item: int, run_id: str, event: dict[str, Any]
) -> tuple[bool, bool]:
    """One child noted: (noted the first time, the pipeline run still running)."""
    (noted,), running, _ = s.mark_children(pipeline_id, seq, [(item, run_id, event)])
    return noted, running


def test_noting_a_child_says_whether_the_pipeline_run_was_still_running() -> None:
    s = step_of(items=2, cap=2)
    s.reserve("p", 0, 50)
    event = {"kind": "child_started", "item": 0}
    assert mark_child(s, "p", 0, 0, child_run_id("p", 0, 0, 0), event) == (True, True)
    assert mark_child(s, "p", 0, 0, child_run_id("p", 0, 0, 0), event) == (False, True)
    assert s.end("p", 0, "cancelled") == "ok"
    # Noted after the end: its creator cancels it, the end's cascade may have looked before.
    assert mark_child(s, "p", 0, 1, child_run_id("p", 0, 1, 0), event) == (True, False)


def started_events(s: PipelineStore) -> list[int]:
    return [e["item"] for _, e in s.events("p") if e["kind"] == "child_started"]


def test_a_child_its_creator_died_before_noting_is_noted_once_with_its_end() -> None:
    # The creator of item 0's child run was killed between creating it and noting it; the child
    # ran and its callback records it: its start is in the stream once, noted by the record.
    s = step_of(items=2, cap=2)
    s.reserve("p", 0, 50)
    run_0, run_1 = child_run_id("p", 0, 0, 0), child_run_id("p", 0, 1, 0)
    mark_child(s, "p", 0, 1, run_1, {"kind": "child_started", "item": 1, "run_id": run_1})
    for item, run_id in ((0, run_0), (1, run_1)):
        started = {"kind": "child_started", "item": item, "run_id": run_id}
        result = {"run_id": run_id, "status": "completed"}
        s.record("p", 0, item, 0, result, {"kind": "child_ended", "item": item}, started)
    assert s.children("p", 0) == {0: run_0, 1: run_1}
    assert sorted(started_events(s)) == [0, 1]
    # A late note by a creator that was only slow adds nothing.
    assert mark_child(s, "p", 0, 0, run_0, {"kind": "child_started", "item": 0, "run_id": run_0})[0] is False
    assert sorted(started_events(s)) == [0, 1]


def test_a_batch_of_children_is_noted_in_one_call_each_once() -> None:
    # A pump notes the children of a batch together; one of them noted already (by a record, or a
    # slower creator) is not noted nor announced again.
    s = step_of(items=3, cap=3)
    s.reserve("p", 0, 50)
    runs = [child_run_id("p", 0, item, 0) for item in range(3)]
    mark_child(s, "p", 0, 1, runs[1], {"kind": "child_started", "item": 1, "run_id": runs[1]})
    batch = [
        (item, runs[item], {"kind": "child_started", "item": item, "run_id": runs[item]}) for item in range(3)
    ]
    assert s.mark_children("p", 0, batch) == ([True, False, True], True, [])
    assert s.children("p", 0) == dict(enumerate(runs))
    assert sorted(started_events(s)) == [0, 1, 2]
    assert s.mark_children("p", 0, batch) == ([False, False, False], True, [])
    assert s.end("p", 0, "cancelled") == "ok"
    assert s.mark_children("p", 0, batch)[1] is False


def test_a_record_made_with_a_creation_time_read_before_is_refused_once_the_id_names_another_run() -> None:
    s = step_of(items=2, cap=2)
    assert len(s.reserve("p", 0, 50)) == 2
    meta = s.meta("p")
    assert meta is not None
    result = {"run_id": child_run_id("p", 0, 0, 0), "status": "completed"}
    ended = {"kind": "child_ended", "item": 0}

    # What a process read of another pipeline run under the same id (one that expired since).
    assert s.record("p", 0, 0, 0, result, ended, created_at=meta.created_at - 60).answer == "unknown"
    assert s.results("p", 0) == {}
    assert s.record("p", 0, 0, 0, result, ended, created_at=meta.created_at).answer == "waiting"
    assert s.results("p", 0) == {0: result}


# -- the step's pump lease: ends close together share one pump -------------------------------------


def lease(token: str) -> PumpLease:
    return PumpLease(token, 60_000)


def end(s: PipelineStore, item: int, token: str, want: int = 50) -> Recorded:
    """Item ``item``'s child (attempt 0) ended: its record, taking the pump lease if it can."""
    result = {"run_id": child_run_id("p", 0, item, 0), "status": "completed"}
    return s.record(
        "p", 0, item, 0, result, {"kind": "child_ended", "item": item}, want=want, lease=lease(token)
    )


def note(
    s: PipelineStore, items: list[int], token: str, want: int = 50, hand_on: bool = False
) -> list[ItemToStart]:
    """The lease holder ``token`` notes the children it created for ``items``: the items it takes next."""
    children = [(i, child_run_id("p", 0, i, 0), {"kind": "child_started", "item": i}) for i in items]
    _, running, taken = s.mark_children("p", 0, children, lease(token), want, hand_on)
    assert running
    return taken


def live(s: PipelineStore) -> int:
    meta = s.meta("p")
    assert meta is not None
    return meta.started - meta.done


def test_an_end_takes_the_pump_lease_and_its_room_and_an_end_meanwhile_leaves_its_room_to_the_holder() -> (
    None
):
    s = step_of(items=6, cap=2)
    assert [i for i, _, _ in s.reserve("p", 0, 50)] == [0, 1]  # the step's first pump (no lease)
    pump_key = s.keys.pipe_pump("p", 0)
    assert end(s, 0, "a") == Recorded("recorded", [(2, 0, "item 2")])
    assert s.redis.get(pump_key) == "a"
    # Item 1 ends while "a" creates item 2's child: its record leaves its room to "a".
    assert end(s, 1, "b") == Recorded("pumping", [])
    assert live(s) == 1
    # Noting item 2's child, "a" takes item 3 in the room item 1 gave back, and keeps the lease...
    assert note(s, [2], "a") == [(3, 0, "item 3")]
    assert live(s) == 2 and s.redis.get(pump_key) == "a"
    # ...until no room is left: then it gives the lease up, and the next end takes it.
    assert note(s, [3], "a") == []
    assert s.redis.get(pump_key) is None
    assert end(s, 2, "c") == Recorded("recorded", [(4, 0, "item 4")])
    assert s.redis.get(pump_key) == "c"


def test_a_lease_handed_on_is_given_up_while_a_child_is_live_and_kept_while_none_is() -> None:
    s = step_of(items=5, cap=2)
    s.reserve("p", 0, 50)
    assert end(s, 0, "a").items == [(2, 0, "item 2")]
    assert end(s, 1, "b").answer == "pumping"
    # Item 2's child is live: its record will take the lease and the room item 1 gave back.
    assert note(s, [2], "a", hand_on=True) == []
    assert s.redis.get(s.keys.pipe_pump("p", 0)) is None
    assert end(s, 2, "c").items == [(3, 0, "item 3"), (4, 0, "item 4")]
    # Every child of the step ended before its holder noted them: no record would come to take
    # the room, so handing on, the holder goes on taking.
    s = step_of(items=4, cap=1)
    s.reserve("p", 0, 50)
    assert end(s, 0, "a").items == [(1, 0, "item 1")]
    assert end(s, 1, "b").answer == "pumping"  # its child ran and ended before "a" noted it
    assert live(s) == 0
    assert note(s, [1], "a", hand_on=True) == [(2, 0, "item 2")]


def test_a_lapsed_lease_lets_the_next_end_pump_and_its_late_holder_takes_nothing() -> None:
    s = step_of(items=6, cap=2)
    s.reserve("p", 0, 50)
    assert end(s, 0, "a").items == [(2, 0, "item 2")]
    s.redis.delete(s.keys.pipe_pump("p", 0))  # "a" was killed: its lease lapsed
    assert end(s, 1, "b").items == [(3, 0, "item 3")]
    # "a" was only slow: its note notes, takes nothing and leaves the lease to its holder.
    assert note(s, [2], "a") == []
    assert s.redis.get(s.keys.pipe_pump("p", 0)) == "b"
    assert s.children("p", 0)[2] == child_run_id("p", 0, 2, 0)


def test_a_record_that_takes_nothing_takes_no_lease() -> None:
    s = step_of(items=3, cap=2)
    s.reserve("p", 0, 50)
    result = {"run_id": child_run_id("p", 0, 0, 0), "status": "completed"}
    assert s.record("p", 0, 0, 0, result, {"kind": "child_ended", "item": 0}) == Recorded("recorded", [])
    assert s.redis.get(s.keys.pipe_pump("p", 0)) is None
    assert s.reserve("p", 0, 50) == [(2, 0, "item 2")]


@pytest.mark.parametrize("seed", range(40))
def test_ends_and_pumps_in_any_order_start_every_item_once_within_the_cap(seed: int) -> None:
    """A pool's ends and lease holders, interleaved at random: a child may end before its creator
    notes it, several ends may meet one holder, holders hand the lease on. Every item is started
    once, the cap is never exceeded, and the step finishes with no sweeper (no room is left with
    the lease given up and no child live to take it)."""
    rng = random.Random(seed)
    items, cap = rng.randint(1, 25), rng.randint(1, 5)
    s = step_of(items, cap)
    taken: list[int] = []
    running: set[int] = set()  # children created, their end not recorded
    holders: dict[str, tuple[list[ItemToStart], bool]] = {}  # token -> (items taken, created yet)

    def took(token: str, batch: list[ItemToStart]) -> None:
        taken.extend(i for i, _, _ in batch)
        if batch:
            holders[token] = (batch, False)

    first = s.reserve("p", 0, 50)
    taken.extend(i for i, _, _ in first)
    running.update(i for i, _, _ in first)
    s.mark_children("p", 0, [(i, child_run_id("p", 0, i, 0), {"kind": "child_started"}) for i, _, _ in first])
    while running or holders:
        moves = [("end", str(i)) for i in running] + [("pump", token) for token in holders]
        kind, which = rng.choice(sorted(moves))
        if kind == "end":
            running.remove(int(which))
            token = f"t{rng.random()}"
            recorded = end(s, int(which), token, want=rng.randint(1, 3))
            assert recorded.answer in ("recorded", "pumping", "waiting", "complete")
            took(token, recorded.items)
        else:
            batch, created = holders.pop(which)
            if not created:  # its children are created: they may end before it notes them
                running.update(i for i, _, _ in batch)
                holders[which] = (batch, True)
            else:
                more = note(s, [i for i, _, _ in batch], which, rng.randint(1, 3), hand_on=rng.random() < 0.3)
                took(which, more)
        assert 0 <= live(s) <= cap
    assert sorted(taken) == list(range(items))
    meta = s.meta("p")
    assert meta is not None and meta.done == meta.total == items
