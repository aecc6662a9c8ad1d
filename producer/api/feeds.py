"""One reader per followed run and API process, however many clients follow it.

A :class:`Feed` waits in ``XREAD BLOCK`` on one run's event stream and hands each batch it reads
to every subscriber's queue, so 100 followers of a run cost one Redis connection and one read per
batch, not 100. A subscriber that resumes after an event id first reads what it missed with
``XRANGE`` and then takes the feed's batches, skipping ids it already sent:

1. it registers its queue with the feed, then waits until the feed has fixed the id it reads
   after (the stream's last id when the feed started);
2. it reads every event after its own cursor with ``XRANGE`` (everything up to at least the
   feed's starting id, since it reads after the feed started), until a read returns less than a
   full batch (it reached the stream's end as it was then);
3. it sends the feed's batches, skipping ids at or below the last one it sent.

Every event is in (2) or (3), and the skip sends none twice. The subscriber that starts a feed
(a run's first follower in this process, the usual case) has the feed read after its own cursor
instead: it needs no (2), and its stream opens on the feed's first read (one round trip where it
took three or four: the stream's last id, the catch-up, its empty end, then the live read).

A subscriber whose queue holds more than ``MAX_QUEUED`` batches (a client that does not read) is
dropped: its stream ends, and the client resumes with ``Last-Event-ID`` without losing anything.
A feed ends with its last subscriber, and after a batch that ends with the run's end event: every
follower's stream ends there, so the feed does not wait in another ``XREAD BLOCK`` only to be
cancelled in it, which would cost its connection (redis-py drops a connection whose reply was
cancelled) and the next stream a new one: a connect and its handshake on the way to its first
event. A subscriber left on a feed that ended this way (one that had asked to resume past the end
event) is dropped and resumes. A feed whose read fails ends its subscribers' streams (they resume
on another try).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import redis.asyncio as aioredis

from shared.events import END_EVENTS, stream_after

__all__ = ["BATCH", "Entry", "Feed", "FeedHub", "MAX_QUEUED", "after", "sse_frame"]

log = logging.getLogger("wesichain.api")

#: Events read per round, by a feed or by a subscriber catching up.
BATCH = 500
#: Batches a subscriber may have waiting before it is dropped.
MAX_QUEUED = 1000


class Entry(tuple[str, str]):
    """One event as read: its stream id and its stored JSON (it unpacks as that pair). Its kind and
    its SSE frame are worked out once, on first use: a feed hands the same entries to every
    follower, so 100 followers of a run parse and format each event once, not 100 times."""

    def __new__(cls, event_id: str, raw: str) -> Entry:
        return super().__new__(cls, (event_id, raw))

    @property
    def id(self) -> str:
        return self[0]

    @functools.cached_property
    def kind(self) -> str | None:
        kind = json.loads(self[1]).get("kind")
        return kind if isinstance(kind, str) else None

    @functools.cached_property
    def frame(self) -> str:
        return sse_frame(self[0], self[1])


def sse_frame(event_id: str, raw: str) -> str:
    """One event as an SSE message: its stream id as ``id``, the event's JSON (with ``id``) as data."""
    return f'id: {event_id}\ndata: {{"id":"{event_id}",{raw[1:]}\n\n'


def after(a: str, b: str) -> bool:
    """Whether stream id ``a`` comes after ``b`` (``ms-seq``, compared as numbers)."""
    a_ms, _, a_seq = a.partition("-")
    b_ms, _, b_seq = b.partition("-")
    return (int(a_ms), int(a_seq or 0)) > (int(b_ms), int(b_seq or 0))


def _entries(raw: Any) -> list[Entry]:
    return [Entry(str(eid), str(fields["e"])) for eid, fields in raw]


class Feed:
    """The reader of one run's stream in this process, and its subscribers' queues."""

    def __init__(self, hub: FeedHub, key: str, start_after: str | None = None, opener: Any = None) -> None:
        self.hub = hub
        self.key = key
        self.queues: set[asyncio.Queue[list[Entry] | None]] = set()
        self.ready = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        #: The id the feed reads after (None: the stream's last when it starts).
        self.start_after = start_after
        #: The queue of the subscriber whose cursor is ``start_after``: it has nothing to catch up.
        self.opener: asyncio.Queue[list[Entry] | None] | None = opener

    def start(self) -> None:
        self.task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        try:
            cursor = self.start_after
            if cursor != "0-0":  # from the start (most first followers): no id can be past the end
                latest = await self.hub.redis.xrevrange(self.key, count=1)
                last = str(latest[0][0]) if latest else "0-0"
                # An opener's cursor past the stream's end (a client's made-up Last-Event-ID) must
                # not be where the feed reads from: every later follower of the run would miss what
                # comes before it. The opener filters the entries before its own cursor itself.
                if cursor is None or after(cursor, last):
                    cursor = last
            self.ready.set()
            # A feed its last subscriber left is forgotten and cancelled, but the cancel can be
            # lost inside the Redis client (Python 3.11's asyncio.wait_for, which redis-py sends
            # each command in, returns the result of a send that had just finished instead of
            # raising it): a forgotten feed stops after its read, or it reads for no one for as
            # long as the run lives, on a connection of the pool.
            while self.hub.feeds.get(self.key) is self:
                reply: Any = await self.hub.redis.xread(
                    {self.key: cursor}, count=BATCH, block=self.hub.block_ms
                )
                if not reply:
                    continue
                batch = _entries(reply[0][1])
                cursor = batch[-1][0]
                for queue in list(self.queues):
                    if queue.qsize() >= MAX_QUEUED:
                        self._drop(queue)
                    else:
                        queue.put_nowait(batch)
                if batch[-1].kind in END_EVENTS:
                    # The stream ends (for now) with the run's end event. No await between the
                    # batch and this: no subscriber joins in between. Those that got the end event
                    # stop at it; any other resumes on a feed of its own. (Events after an end
                    # event, a run that went on, keep the feed reading.)
                    self.hub.forget(self)
                    for queue in list(self.queues):
                        self._drop(queue)
                    return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("reading %s failed; its followers' streams end (they resume)", self.key)
            self.hub.forget(self)
            for queue in list(self.queues):
                self._drop(queue)
            self.ready.set()

    def _drop(self, queue: asyncio.Queue[list[Entry] | None]) -> None:
        self.queues.discard(queue)
        queue.put_nowait(None)


class FeedHub:
    """This process's feeds, by stream key."""

    def __init__(self, redis: aioredis.Redis, block_ms: int) -> None:
        self.redis = redis
        self.block_ms = block_ms
        self.feeds: dict[str, Feed] = {}

    def forget(self, feed: Feed) -> None:
        if self.feeds.get(feed.key) is feed:
            del self.feeds[feed.key]

    @contextlib.asynccontextmanager
    async def subscribe(
        self, key: str, cursor: str | None = None
    ) -> AsyncIterator[tuple[Feed, asyncio.Queue[list[Entry] | None]]]:
        """A queue that gets every batch the run's feed reads from now on (registered first). A
        feed this starts reads after ``cursor`` (None: after the stream's last id), and the queue
        is its ``opener``."""
        queue: asyncio.Queue[list[Entry] | None] = asyncio.Queue()
        feed = self.feeds.get(key)
        if feed is None or feed.task is None or feed.task.done():
            opener = queue if cursor is not None else None
            feed = self.feeds[key] = Feed(self, key, cursor, opener)
            feed.start()
        feed.queues.add(queue)
        try:
            await feed.ready.wait()
            yield feed, queue
        finally:
            feed.queues.discard(queue)
            if not feed.queues and feed.task is not None:
                self.forget(feed)
                feed.task.cancel()

    async def follow(self, key: str, cursor: str, idle_s: float) -> AsyncGenerator[list[Entry] | None, None]:
        """Batches of events after ``cursor``, in order, each once; ``None`` after ``idle_s``
        without any (the caller may stop or go on). Ends when the feed drops this follower."""
        async with self.subscribe(key, cursor) as (feed, queue):
            caught_up = feed.opener is queue  # the feed reads after this cursor itself
            while not caught_up:  # catch up on what came before the feed's first read
                raw = await self.redis.xrange(key, min=stream_after(cursor), count=BATCH) or []
                caught_up = len(raw) < BATCH  # the stream's end as it was after the feed started
                if raw:
                    batch = _entries(raw)
                    cursor = batch[-1][0]
                    yield batch
            while True:
                try:
                    # Not wait_for, which runs the get in a task of its own: a task per follower
                    # for every event, with 100 followers of a run.
                    async with asyncio.timeout(idle_s):
                        live = await queue.get()
                except TimeoutError:
                    yield None
                    continue
                if live is None:
                    return
                fresh = [entry for entry in live if after(entry[0], cursor)]
                if fresh:
                    cursor = fresh[-1][0]
                    yield fresh
