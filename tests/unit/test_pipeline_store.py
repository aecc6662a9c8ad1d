"""A step's bookkeeping scripts on the in-process Redis stand-in: what a recorded item says about
starting more, and the run's status seen by the noting of a child."""

from __future__ import annotations

from typing import Any

import fakeredis

from shared.keys import Keys
from shared.pipeline.store import PipelineStore, child_run_id


def step_of(items: int, cap: int) -> PipelineStore:
    s = PipelineStore(fakeredis.FakeRedis(decode_responses=True), Keys(prefix="t:"), retention_s=3600)
    assert s.create("p", "chain", "in", None)
    assert s.advance("p", -1, "chain", 0, "map", cap, {"name": "m"}, [f"item {i}" for i in range(items)])
    return s


def record(s: PipelineStore, item: int) -> str:
    result = {"run_id": child_run_id("p", 0, item, 0), "status": "completed"}
    return s.record("p", 0, item, 0, result, {"kind": "child_ended", "item": item})


def test_a_recorded_item_says_whether_items_wait_to_start_in_the_room_it_gave_back() -> None:
    s = step_of(items=3, cap=2)
    assert s.reserve("p", 0, 50) == range(2)
    assert s.items_to_start("p", 0, range(2)) == [("item 0", 0), ("item 1", 0)]
    assert record(s, 0) == "recorded"  # item 2 waits: a pump takes the room
    assert s.reserve("p", 0, 50) == range(2, 3)
    assert record(s, 1) == "waiting"  # every item is started: there is nothing to pump
    assert record(s, 1) == "dup"
    assert record(s, 2) == "complete"


def mark_child(
    s: PipelineStore, pipeline_id: str, seq: int, item: int, run_id: str, event: dict[str, Any]
) -> tuple[bool, bool]:
    """One child noted: (noted the first time, the pipeline run still running)."""
    (noted,), running = s.mark_children(pipeline_id, seq, [(item, run_id, event)])
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
    assert s.mark_children("p", 0, batch) == ([True, False, True], True)
    assert s.children("p", 0) == dict(enumerate(runs))
    assert sorted(started_events(s)) == [0, 1, 2]
    assert s.mark_children("p", 0, batch) == ([False, False, False], True)
    assert s.end("p", 0, "cancelled") == "ok"
    assert s.mark_children("p", 0, batch)[1] is False


def test_a_record_made_with_a_creation_time_read_before_is_refused_once_the_id_names_another_run() -> None:
    s = step_of(items=2, cap=2)
    assert s.reserve("p", 0, 50) == range(2)
    meta = s.meta("p")
    assert meta is not None
    result = {"run_id": child_run_id("p", 0, 0, 0), "status": "completed"}
    ended = {"kind": "child_ended", "item": 0}

    # What a process read of another pipeline run under the same id (one that expired since).
    assert s.record("p", 0, 0, 0, result, ended, created_at=meta.created_at - 60) == "unknown"
    assert s.results("p", 0) == {}
    assert s.record("p", 0, 0, 0, result, ended, created_at=meta.created_at) == "waiting"
    assert s.results("p", 0) == {0: result}
