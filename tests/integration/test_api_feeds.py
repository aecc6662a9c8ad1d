"""The API's shared event readers on a real redis-server: followers that join at any moment,
from any event id, while events are appended, each get every later event exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import uuid
from typing import cast

import pytest
import redis.asyncio as aioredis

from producer.api import feeds
from producer.api.feeds import FeedHub
from tests.broker import is_cluster
from tests.harness import RedisServer

EVENTS = 400


def _async_client(url: str) -> aioredis.Redis:
    """An asyncio client of the session's run-state Redis (a cluster client on a cluster)."""
    if is_cluster(url):
        return cast(aioredis.Redis, aioredis.RedisCluster.from_url(url, decode_responses=True))
    return aioredis.Redis.from_url(url, decode_responses=True)


async def _first_ids(hub: FeedHub, key: str, cursor: str, n: int) -> list[str]:
    """The ids of the first ``n`` events a follower from ``cursor`` gets (fewer if the feed lets it
    go first)."""
    got: list[str] = []
    async with contextlib.aclosing(hub.follow(key, cursor, idle_s=0.5)) as batches:
        async for batch in batches:
            if batch is not None:
                got.extend(event_id for event_id, _ in batch)
            if len(got) >= n:
                break
    return got


async def _followers_scenario(url: str, followers: int) -> None:
    client = _async_client(url)
    hub = FeedHub(client, block_ms=200)
    key = f"feedtest:{uuid.uuid4().hex}"
    appended: list[str] = []
    rng = random.Random(7)

    async def writer() -> None:
        for i in range(EVENTS):
            appended.append(str(await client.xadd(key, {"e": json.dumps({"kind": "Tick", "i": i})})))
            if rng.random() < 0.2:
                await asyncio.sleep(rng.random() * 0.01)

    async def follower() -> tuple[str, list[str]]:
        await asyncio.sleep(rng.random() * 0.5)
        cursor = rng.choice(appended) if appended and rng.random() < 0.7 else "0-0"
        got: list[str] = []
        async with contextlib.aclosing(hub.follow(key, cursor, idle_s=0.5)) as batches:
            async for batch in batches:
                if batch is not None:
                    got.extend(event_id for event_id, _ in batch)
                if got and got[-1] == appended[-1] and len(appended) == EVENTS:
                    break
        return cursor, got

    results = await asyncio.gather(writer(), *(follower() for _ in range(followers)))
    for cursor, got in results[1:]:  # type: ignore[misc]
        start = 0 if cursor == "0-0" else appended.index(cursor) + 1
        assert got == appended[start:], (cursor, len(got), len(appended[start:]))
    # Every follower left: no feed is left reading.
    assert hub.feeds == {}
    await client.aclose()


def test_followers_joining_anywhere_get_every_later_event_once(redis_server: RedisServer) -> None:
    asyncio.run(_followers_scenario(redis_server.url, followers=40))


async def _slow_follower_scenario(url: str) -> None:
    client = _async_client(url)
    hub = FeedHub(client, block_ms=200)
    key = f"feedtest:{uuid.uuid4().hex}"
    async with hub.subscribe(key) as (feed, stuck):
        for i in range(10):  # separate batches: the feed reads each before the next is added
            await client.xadd(key, {"e": json.dumps({"kind": "Tick", "i": i})})
            await asyncio.sleep(0.05)
        # The queue that nobody reads was dropped after MAX_QUEUED batches, its end marked.
        assert stuck not in feed.queues
        items = [stuck.get_nowait() for _ in range(stuck.qsize())]
        assert len(items) == feeds.MAX_QUEUED + 1 and items[-1] is None
    assert hub.feeds == {}
    await client.aclose()


def test_a_follower_that_does_not_read_is_dropped(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(feeds, "MAX_QUEUED", 3)
    asyncio.run(_slow_follower_scenario(redis_server.url))


async def _future_cursor_scenario(url: str) -> None:
    client = _async_client(url)
    hub = FeedHub(client, block_ms=200)
    key = f"feedtest:{uuid.uuid4().hex}"
    before = [str(await client.xadd(key, {"e": json.dumps({"kind": "Tick", "i": i})})) for i in range(3)]
    future = "99999999999999-0"

    # The first follower opens the run's feed with an id past the stream's end (a client's made-up
    # Last-Event-ID); one that joins after it from the start must still get every event.
    opener = asyncio.create_task(_first_ids(hub, key, future, 1))
    await asyncio.sleep(0)
    while key not in hub.feeds or not hub.feeds[key].ready.is_set():
        await asyncio.sleep(0.01)
    joiner = asyncio.create_task(_first_ids(hub, key, "0-0", 6))
    later = [str(await client.xadd(key, {"e": json.dumps({"kind": "Tick", "i": 3 + i})})) for i in range(3)]
    assert await asyncio.wait_for(joiner, 30) == before + later
    opener.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await opener
    await client.aclose()


def test_a_follower_from_past_the_streams_end_does_not_blind_the_others(redis_server: RedisServer) -> None:
    asyncio.run(_future_cursor_scenario(redis_server.url))


async def _end_event_scenario(url: str) -> None:
    client = _async_client(url)
    hub = FeedHub(client, block_ms=200)
    key = f"feedtest:{uuid.uuid4().hex}"
    first = str(await client.xadd(key, {"e": json.dumps({"kind": "Tick", "i": 0})}))

    async def until_end(cursor: str) -> list[str]:
        got: list[str] = []
        async with contextlib.aclosing(hub.follow(key, cursor, idle_s=0.5)) as batches:
            async for batch in batches:
                if batch is not None:
                    got.extend(event_id for event_id, _ in batch)
                    if any(entry.kind == "Completed" for entry in batch):
                        break
        return got

    # One follower from the start opens the feed; one that asked to resume past the stream's end
    # (a made-up Last-Event-ID) joins it.
    opener = asyncio.create_task(until_end("0-0"))
    while key not in hub.feeds or not hub.feeds[key].ready.is_set():
        await asyncio.sleep(0.01)
    feed = hub.feeds[key]
    past_end = asyncio.create_task(until_end("99999999999999-0"))
    await asyncio.sleep(0.05)
    end = str(await client.xadd(key, {"e": json.dumps({"kind": "Completed"})}))
    assert await asyncio.wait_for(opener, 30) == [first, end]
    # The feed stopped after the end event by itself, not cancelled in another blocked read, and
    # let the follower it could not serve go (its stream ends; it resumes on a feed of its own).
    assert await asyncio.wait_for(past_end, 30) == []
    assert feed.task is not None and feed.task.done() and not feed.task.cancelled()
    assert hub.feeds == {}
    # A run interrupted and then resumed appends after its end event: a new follower gets it.
    later = str(await client.xadd(key, {"e": json.dumps({"kind": "Completed", "again": True})}))
    assert await asyncio.wait_for(until_end(end), 30) == [later]
    await client.aclose()


def test_a_feed_ends_after_the_runs_end_event(redis_server: RedisServer) -> None:
    asyncio.run(_end_event_scenario(redis_server.url))


async def _went_on_scenario(url: str) -> None:
    client = _async_client(url)
    hub = FeedHub(client, block_ms=200)
    key = f"feedtest:{uuid.uuid4().hex}"
    # A run that ended and went on (interrupted, then resumed): its end event is not the stream's last.
    ended = str(await client.xadd(key, {"e": json.dumps({"kind": "Interrupted"})}))
    went_on = str(await client.xadd(key, {"e": json.dumps({"kind": "Tick"})}))

    # One follower from the start opens the feed, one from the end event joins: the feed's first
    # batch holds the end event, and it reads on for the one that follows what came after.
    opener = asyncio.create_task(_first_ids(hub, key, "0-0", 3))
    while key not in hub.feeds or not hub.feeds[key].ready.is_set():
        await asyncio.sleep(0.01)
    joiner = asyncio.create_task(_first_ids(hub, key, ended, 2))
    await asyncio.sleep(0.05)
    later = str(await client.xadd(key, {"e": json.dumps({"kind": "Tick"})}))
    assert await asyncio.wait_for(joiner, 30) == [went_on, later]
    assert await asyncio.wait_for(opener, 30) == [ended, went_on, later]
    await client.aclose()


def test_a_feed_reads_on_past_an_end_event_the_run_went_on_after(redis_server: RedisServer) -> None:
    asyncio.run(_went_on_scenario(redis_server.url))
