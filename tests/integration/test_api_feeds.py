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
