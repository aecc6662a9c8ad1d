"""The thread scripts (``thread_admit``, ``thread_release``, ``thread_park``, ``thread_wake``,
``thread_cancel``, ``thread_forget``) on a real redis-server: admission under each policy, an
idempotent re-admission, the hand-on order, a cancel that unparks, and forget's score check."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from shared import fsm, protocol
from shared.messages import UserMessage
from shared.state import Phase
from shared.store import RunStore, ThreadTurn
from tests.harness import RedisServer
from tests.store_support import make_store
from worker.testing.runs import claim, commit, create, ended_run, live_run

TENANT = "acme"
THREAD = "t1"


@pytest.fixture
def rds(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def store(rds: redis.Redis) -> RunStore:
    return make_store(rds)


def _admit(store: RunStore, run_id: str, policy: str) -> tuple[str, str, str, tuple[str, ...]]:
    turn = store.admit_to_thread(TENANT, THREAD, run_id, policy)  # type: ignore[arg-type]
    return turn.verdict, turn.holder, turn.previous, turn.ahead


def test_enqueue_admits_the_first_and_queues_the_rest_in_submit_order(store: RunStore) -> None:
    assert _admit(store, "a", "enqueue") == ("go", "", "", ())
    assert _admit(store, "b", "enqueue") == ("wait", "a", "a", ())
    assert _admit(store, "c", "enqueue") == ("wait", "a", "b", ())
    assert store.thread_holder(TENANT, THREAD)[0] == "a"
    assert store.thread_waiting(TENANT, THREAD) == ["b", "c"]
    assert store.rolled_back(TENANT, THREAD) == set()


@pytest.mark.parametrize("policy", ["enqueue", "interrupt", "rollback"])
def test_a_re_admission_reads_the_runs_place_and_changes_nothing(store: RunStore, policy: str) -> None:
    # The submit admits a run, and its start admits it again (the same policy): the second is a replay.
    first = [_admit(store, run_id, policy) for run_id in "abc"]
    marked = store.rolled_back(TENANT, THREAD)
    assert [_admit(store, run_id, policy) for run_id in "abc"] == [
        ("go", "a", "", ()),
        *[(v, "a", p, ahead) for v, _, p, ahead in first[1:]],
    ]
    assert store.thread_waiting(TENANT, THREAD) == ["b", "c"]
    assert store.rolled_back(TENANT, THREAD) == marked
    order = store.redis.lrange(store.keys.thread(TENANT, THREAD), 0, -1)
    assert order == ["a", "b", "c"]
    for run_id in "abc":
        store.hand_thread_on(TENANT, THREAD, run_id)
    # It had its turn: a replay of its start does not take the thread again.
    assert _admit(store, "a", policy) == ("ended", "", "", ())
    assert store.thread_holder(TENANT, THREAD)[0] == ""


def test_reject_is_refused_on_a_busy_thread_naming_the_holder_and_writes_nothing(store: RunStore) -> None:
    assert _admit(store, "a", "reject") == ("go", "", "", ())
    assert _admit(store, "b", "reject") == ("busy", "a", "", ())
    order = store.redis.lrange(store.keys.thread(TENANT, THREAD), 0, -1)
    assert order == ["a"]
    assert store.thread_waiting(TENANT, THREAD) == []


def test_reject_is_not_refused_by_a_holder_that_ended_before_its_hand_on(store: RunStore) -> None:
    # A run's terminal commit is seen before its worker hands the thread on (a second step, on the
    # thread's slot): a caller that saw it end and sends the next message at once is admitted.
    ended = ended_run(store)
    assert _admit(store, ended, "enqueue")[0] == "go"  # it holds the thread, and has ended since
    parked = create(store)
    held = claim(store, parked)
    assert _admit(store, parked.run_id, "enqueue")[0] == "wait"
    assert store.park_for_thread(parked.run_id, parked.version, held.ref.token, {"thread_id": THREAD})

    # A run waits: the hand-on gives it the thread and unparks it (its start is the caller's to
    # publish), and the new run is refused by it, the holder now.
    turn = store.admit_to_thread(TENANT, THREAD, "next", "reject")
    assert (turn.verdict, turn.holder, turn.woken) == ("busy", parked.run_id, parked.run_id)
    assert store.thread_wait(parked.run_id) is None
    # Nothing waits once that one has ended too: the thread is free for the next message.
    store.redis.hset(store.keys.thread_state(TENANT, THREAD), protocol.THREAD_ACTIVE, ended)
    assert store.admit_to_thread(TENANT, THREAD, "next", "reject") == ThreadTurn("go", "", "", (), "")
    assert store.thread_holder(TENANT, THREAD)[0] == "next"
    # A holder that has not ended still refuses, and nothing is woken.
    running = live_run(store)
    store.redis.hset(store.keys.thread_state(TENANT, "t2"), protocol.THREAD_ACTIVE, running)
    assert store.admit_to_thread(TENANT, "t2", "other", "reject") == ThreadTurn("busy", running, "", (), "")


def test_interrupt_names_every_run_ahead_and_rollback_also_marks_them(store: RunStore) -> None:
    _admit(store, "a", "enqueue")
    _admit(store, "b", "enqueue")
    assert _admit(store, "c", "interrupt") == ("wait", "a", "b", ("a", "b"))
    assert store.rolled_back(TENANT, THREAD) == set()
    assert _admit(store, "d", "rollback") == ("wait", "a", "c", ("a", "b", "c"))
    assert store.rolled_back(TENANT, THREAD) == {"a", "b", "c"}


def test_release_hands_on_in_thread_order_and_only_from_the_holder(store: RunStore) -> None:
    for run_id in "abcd":
        _admit(store, run_id, "enqueue")
    # c ended while it waited (cancelled): it leaves the queue, the holder keeps the thread.
    assert store.hand_thread_on(TENANT, THREAD, "c") is None
    assert store.thread_holder(TENANT, THREAD)[0] == "a"
    assert store.thread_waiting(TENANT, THREAD) == ["b", "d"]
    assert store.hand_thread_on(TENANT, THREAD, "a") == "b"
    assert store.hand_thread_on(TENANT, THREAD, "a") is None  # a replay hands nothing on
    assert store.hand_thread_on(TENANT, THREAD, "b") == "d"
    assert store.hand_thread_on(TENANT, THREAD, "d") is None
    assert store.thread_holder(TENANT, THREAD) == ("", 0.0)


def test_park_then_wake_once(store: RunStore) -> None:
    head = create(store)
    held = claim(store, head)
    why = {"thread_id": THREAD, "waiting_for": "a"}
    assert not store.park_for_thread(head.run_id, head.version, "another-token", why)
    assert store.park_for_thread(head.run_id, head.version, held.ref.token, why)
    assert store.thread_wait(head.run_id) == why
    assert store.redis.zscore(store.keys.leases_of(head.run_id), head.run_id) is None  # sweeper: hands off
    assert store.wake_from_thread(head.run_id)
    assert not store.wake_from_thread(head.run_id)  # only one waker publishes the start
    assert store.thread_wait(head.run_id) is None
    assert store.redis.zscore(store.keys.leases_of(head.run_id), head.run_id) is not None


def test_a_start_that_goes_clears_a_park_left_by_a_duplicate_racing_its_wake(store: RunStore) -> None:
    # The order a duplicate start can take around a wake: it claims the parked run, the run before
    # it ends and wakes it, the duplicate (still holding its claim) parks it again, and the woken
    # start claims it and goes before the duplicate's second look wakes it. That wake finds it
    # started and leaves its mark; the start's commit must not leave a running run "waiting".
    head = create(store)
    why = {"thread_id": THREAD, "waiting_for": "a"}
    assert store.park_for_thread(head.run_id, head.version, claim(store, head).ref.token, why)
    duplicate = claim(store, head)
    assert store.wake_from_thread(head.run_id)
    assert store.park_for_thread(head.run_id, head.version, duplicate.ref.token, why)
    idle = fsm.Idle(head)
    commit(
        store, idle, idle.start([UserMessage(content="question")], agent_version="1", model="m", max_steps=5)
    )
    assert not store.wake_from_thread(head.run_id)
    assert store.thread_wait(head.run_id) is None
    assert store.load(head.run_id).phase is Phase.THINKING  # type: ignore[union-attr]


def test_a_cancel_unparks_a_parked_run_and_only_flags_any_other(store: RunStore) -> None:
    parked = create(store)
    held = claim(store, parked)
    assert store.park_for_thread(parked.run_id, parked.version, held.ref.token, {"thread_id": THREAD})
    assert store.cancel_unparking(parked.run_id) == (Phase.IDLE, True)
    assert store.cancel_requested(parked.run_id)
    assert store.thread_wait(parked.run_id) is None
    # Watched by the sweeper from now on, like any queued start: a lost publish is sent again.
    assert store.redis.zscore(store.keys.leases_of(parked.run_id), parked.run_id) is not None
    assert store.cancel_unparking(parked.run_id) == (Phase.IDLE, False)  # unparked once

    queued = create(store)
    assert store.cancel_unparking(queued.run_id) == (Phase.IDLE, False)
    assert store.cancel_requested(queued.run_id)
    assert store.cancel_unparking("no-such-run") == (None, False)


def test_forget_drops_a_thread_only_if_untouched_since_it_was_read(store: RunStore) -> None:
    _admit(store, "a", "enqueue")
    (seen,) = list(store.held_threads())
    assert (seen.tenant, seen.thread_id) == (TENANT, THREAD)
    _admit(store, "b", "enqueue")  # touched: its score moved on
    assert not store.forget_thread(seen)
    (again,) = list(store.held_threads())
    assert store.forget_thread(again)
    assert list(store.held_threads()) == []
    assert not store.forget_thread(again)


def test_a_thread_is_per_tenant(store: RunStore) -> None:
    assert _admit(store, "a", "reject") == ("go", "", "", ())
    assert store.admit_to_thread("other", THREAD, "x", "reject").verdict == "go"
    assert store.admit_to_thread(None, THREAD, "y", "reject").verdict == "go"
    assert store.thread_holder("other", THREAD)[0] == "x"
    assert store.thread_holder(None, THREAD)[0] == "y"
    assert store.redis.hget(store.keys.thread_state(TENANT, THREAD), protocol.THREAD_ACTIVE) == "a"
