"""A delivery's acknowledgement, made by the commit that ends its work.

Phase tasks are acknowledged late: on the Redis broker kombu keeps every message a worker holds in
its unacked hash (and the hash's index) until the worker's main process, told by the pool process
that the task returned, removes it there (``ZREM`` and ``HDEL``: kombu sends them in a transaction,
this worker outside one, see :func:`install`). That is one more round trip on every transition's
path, after the commit, and one more for Redis to serve.

When the commit script publishes the next phase (the broker is the store's Redis: see
``producer/publishing.py``), it now runs that removal too, in the same atomic step: the message
leaves kombu's unacked hash exactly when the transition it carried is committed. The task returns
:data:`ACKED_IN_COMMIT`, and the main process then only forgets the delivery in memory (kombu's
prefetch window) instead of sending the ack again.

When the broker is a standalone Redis of its own (beside a Redis Cluster run state), no commit
script reaches it: the removal runs in one transaction with the publish that follows the commit
(``Runtime.publish``), sent by the pool process that committed; after the run's last commit, which
publishes nothing, alone. The message then leaves the unacked hash when its transition is
committed and its next phase is on the broker; a crash between the commit and that publish leaves
it there, as a crash between a commit and its publish always did (a redelivery that finds its run
moved on publishes the outbox again). A transaction the broker refuses acknowledges nothing: the
outbox is marked unsent for a sweeper to send, and the main process acknowledges the message as
kombu does, but with its two removals outside a transaction (a broker at ``maxmemory`` refuses
every command of a transaction, and takes removals alone).

Nothing a redelivery was for is given up. The unacked hash is what Redis restores after a lost
worker; a message whose commit removed it there is one whose transition is committed and whose
next phase is published with it, so its redelivery could only have found its run moved on (a stale
claim) and been dropped. A message whose work did not commit keeps its place, and the worker
acknowledges it as kombu does whatever happened (a commit that was fenced off, replayed, or that
could not publish in the script: the removal runs with the publish or not at all). A worker that
dies whole after such a commit leaves nothing in the unacked hash for the visibility timeout to
hand back an hour later (as a stale delivery). A pool process that dies after it still has its
task sent again by Celery's worker-lost retry (the main process cannot know the commit ran), and
that delivery finds its run moved on, as before.

The delivery tag is the message's own, as kombu's ack takes it (kombu's Redis envelope carries it in
``properties.delivery_tag``, and Celery hands the properties to the task's request): an ack in a
commit removes the entry kombu's ack would remove, and only a commit of the delivery's own run
carries it.

kombu keys the unacked hash by that tag alone, and the tag is whatever the envelope says: an
envelope put on a queue twice, or one forged with another message's tag, would replace the entry a
running delivery holds when it is handed out, and its ack (by kombu, or in its commit) would then
remove that entry while the other delivery still runs. So a tag the hash already holds stays with
the delivery that holds it: a second delivery under it is not recorded there (``HSETNX``, and the
index's ``ZADD NX``), its task is handed no tag (its commit carries no ack), and its ack is made in
memory only. The holder's entry leaves the hash when the holder's own work ends.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from celery.utils.saferepr import saferepr
from kombu.transport import redis as redis_transport
from kombu.transport import virtual
from kombu.utils.json import dumps

from shared.store import BrokerCommand

__all__ = [
    "ACKED_IN_COMMIT",
    "DeliveryAcks",
    "acked_in_commit",
    "clear",
    "forget_acked_in_commit",
    "install",
]

#: What a phase task returns when its commit acknowledged its message (the main process reads it).
ACKED_IN_COMMIT = "acked-in-commit"
#: The same as the pool hands it to the main process (Celery passes a successful task's value on
#: as its ``saferepr``).
_ACKED_REPR = saferepr(ACKED_IN_COMMIT)
#: A delivery tag kombu writes is a UUID; anything much longer is not one (and is never sent on).
_MAX_TAG_CHARS = 128


class _Thread(threading.local):
    """The delivery a thread is running: its run, its message's tag, whether a commit acked it."""

    run_id: str | None = None
    tag: str | None = None
    done = False


_thread = _Thread()


class DeliveryAcks:
    """The acknowledgement of the message each thread of a worker process is running.

    :meth:`begin` when a phase task starts (with its message's tag, or None: nothing to acknowledge
    here), :meth:`commands_for` for each commit script that may carry it, :meth:`committed` when
    one ran it, :meth:`end` when the task returns (and :func:`clear` after every task, whatever
    it did: no later task of the thread carries an ack that is not its own).
    """

    def __init__(self, unacked_key: str, index_key: str) -> None:
        self.unacked_key = unacked_key
        self.index_key = index_key

    def begin(self, run_id: str, tag: object) -> None:
        usable = isinstance(tag, str) and 0 < len(tag) <= _MAX_TAG_CHARS
        _thread.run_id = run_id if usable else None
        _thread.tag = tag if isinstance(tag, str) and usable else None
        _thread.done = False

    def commands_for(self, run_id: str) -> list[BrokerCommand]:
        """The commands that acknowledge this thread's message, for a commit of ``run_id``: none
        when the message was acknowledged already, or is another run's."""
        tag = _thread.tag
        if tag is None or _thread.done or _thread.run_id != run_id:
            return []
        return [("zrem", (self.index_key, tag)), ("hdel", (self.unacked_key, tag))]

    def committed(self, run_id: str, pushed: bool) -> None:
        """A commit of ``run_id`` ran (``pushed``: with the broker commands it carried)."""
        if pushed and _thread.tag is not None and _thread.run_id == run_id:
            _thread.done = True

    def end(self) -> str | None:
        """What the task returns: :data:`ACKED_IN_COMMIT` if a commit acknowledged its message."""
        done = _thread.done
        clear()
        return ACKED_IN_COMMIT if done else None


def clear() -> None:
    """Forget this thread's delivery (after every task, whether or not it returned)."""
    _thread.run_id = _thread.tag = None
    _thread.done = False


def acked_in_commit(retval: object) -> bool:
    """Whether a task's value, as the main process receives it, says its commit acknowledged it."""
    return retval == _ACKED_REPR or retval == ACKED_IN_COMMIT


#: Tags whose messages a commit acknowledged, until the main process's ack of them comes.
_ACKED: set[str] = set()
#: Tags under which a delivery arrived that another message already held in the unacked hash: how
#: many such deliveries of each are not yet acknowledged (their acks are made in memory only).
_UNOWNED: Counter[str] = Counter()
_kombu_ack: Callable[[Any, str], None] | None = None


def forget_acked_in_commit(message: Any) -> None:
    """Have the main process's ack of ``message`` only forget it in memory: its commit removed it
    from the broker's unacked hash already."""
    install()
    tag = getattr(message, "delivery_tag", None)
    if isinstance(tag, str):
        _ACKED.add(tag)


def install() -> None:
    """Wrap kombu's Redis QoS (once per process): a delivery is recorded in the unacked hash only
    under a tag no other message holds there, an ack of a tag in :data:`_ACKED` or of a delivery
    not recorded skips the round trip, and an ack's removals go outside a transaction."""
    global _kombu_ack
    if _kombu_ack is not None:
        return
    kombu_ack = redis_transport.QoS.ack

    def append(self: Any, message: Any, delivery_tag: str) -> None:
        delivery = message.delivery_info
        entry = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])  # type: ignore[no-untyped-call]
        with self.pipe_or_acquire() as pipe:
            held, _ = (
                pipe.hsetnx(self.unacked_key, delivery_tag, entry)
                .zadd(self.unacked_index_key, {delivery_tag: time.time()}, nx=True)
                .execute()
            )
        if not held:
            # Another message holds the tag: this delivery acknowledges nothing there.
            _UNOWNED[delivery_tag] += 1
            message.properties = {**(message.properties or {}), "delivery_tag": None}
        virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]

    def ack(self: Any, delivery_tag: str) -> None:
        if delivery_tag in _ACKED or _UNOWNED[delivery_tag] > 0:
            if delivery_tag in _ACKED:
                _ACKED.discard(delivery_tag)
            else:
                _UNOWNED[delivery_tag] -= 1
                if not _UNOWNED[delivery_tag]:
                    del _UNOWNED[delivery_tag]
            virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]  # in memory only
            return
        kombu_ack(self, delivery_tag)  # type: ignore[no-untyped-call]

    def remove_from_indices(self: Any, delivery_tag: str, pipe: Any = None) -> Any:
        if pipe is None:
            # An ack (or a reject) of its own: its two removals outside MULTI. A Redis at maxmemory
            # refuses every command queued in a transaction, removals included, and kombu only logs
            # an ack it refused: the delivery stayed in the worker's prefetch window for good, and
            # the worker never consumed again. A restore passes its own transaction: kept.
            with self.channel.conn_or_acquire() as client:
                pipe = client.pipeline(transaction=False)
        return pipe.zrem(self.unacked_index_key, delivery_tag).hdel(self.unacked_key, delivery_tag)

    _kombu_ack = kombu_ack
    setattr(redis_transport.QoS, "append", append)  # noqa: B010 (mypy refuses assigning a method)
    setattr(redis_transport.QoS, "ack", ack)  # noqa: B010
    setattr(redis_transport.QoS, "_remove_from_indices", remove_from_indices)  # noqa: B010
