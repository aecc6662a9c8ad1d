"""A delivery's acknowledgement carried by its commit (``worker/acks.py``): which commit carries
it, when it counts as done, and what the main process then skips."""

from __future__ import annotations

import threading
from typing import Any

from celery.utils.saferepr import saferepr
from kombu.transport import redis as redis_transport

from worker import acks
from worker.acks import ACKED_IN_COMMIT, DeliveryAcks, acked_in_commit, forget_acked_in_commit

ACKS = DeliveryAcks("unacked", "unacked_index")


def test_only_a_commit_of_the_delivery_s_own_run_carries_its_ack() -> None:
    ACKS.begin("run-a", "tag-1")
    assert ACKS.commands_for("run-b") == []
    kombu_ack = [("zrem", ("unacked_index", "tag-1")), ("hdel", ("unacked", "tag-1"))]
    assert ACKS.commands_for("run-a") == kombu_ack
    acks.clear()


def test_the_ack_counts_once_a_commit_ran_it_and_is_carried_no_more() -> None:
    ACKS.begin("run-a", "tag-1")
    ACKS.committed("run-a", pushed=False)  # fenced, replayed or not published in the script
    assert ACKS.commands_for("run-a") != []
    ACKS.committed("run-b", pushed=True)
    assert ACKS.commands_for("run-a") != []
    ACKS.committed("run-a", pushed=True)
    assert ACKS.commands_for("run-a") == []
    assert ACKS.end() == ACKED_IN_COMMIT
    assert ACKS.end() is None  # and the thread's delivery is forgotten


def test_a_task_that_committed_nothing_is_acknowledged_as_kombu_does() -> None:
    ACKS.begin("run-a", "tag-1")
    assert ACKS.end() is None


def test_a_tag_that_is_no_kombu_tag_is_never_sent_on() -> None:
    for tag in (None, "", 7, ["x"], "t" * 129):
        ACKS.begin("run-a", tag)
        assert ACKS.commands_for("run-a") == []
    acks.clear()


def test_after_a_task_nothing_of_its_delivery_is_left_for_the_next() -> None:
    ACKS.begin("run-a", "tag-1")
    acks.clear()  # after_return of every task, whatever it did
    assert ACKS.commands_for("run-a") == []


def test_each_thread_has_its_own_delivery() -> None:
    ACKS.begin("run-a", "tag-1")
    seen: list[Any] = []
    other = threading.Thread(target=lambda: seen.append(ACKS.commands_for("run-a")))
    other.start()
    other.join()
    assert seen == [[]]
    acks.clear()


def test_the_main_process_reads_the_value_as_the_pool_hands_it_on() -> None:
    assert acked_in_commit(saferepr(ACKED_IN_COMMIT))
    assert not acked_in_commit(saferepr(None)) and not acked_in_commit("None")


class _Channel:
    do_restore = False  # nothing to restore when the test's QoS is collected


def test_the_main_process_s_ack_of_a_message_its_commit_acked_sends_nothing() -> None:
    sent: list[str] = []

    class QoS(redis_transport.QoS):
        def _remove_from_indices(self, delivery_tag: str, pipe: Any = None) -> Any:
            sent.append(delivery_tag)

            class _Pipe:
                def execute(self) -> None:
                    pass

            return _Pipe()

    qos = QoS(_Channel(), 1)
    qos._delivered["acked"] = object()
    qos._delivered["other"] = object()

    class _Message:
        delivery_tag = "acked"

    forget_acked_in_commit(_Message())
    qos.ack("acked")
    qos.ack("other")
    assert sent == ["other"]
    # Both leave the prefetch window all the same (kombu's in-memory part of an ack).
    assert qos._dirty == {"acked", "other"}
