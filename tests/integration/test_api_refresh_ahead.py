"""The caches a submit on the API's event loop answers from are read again before they expire.

A submit is served on the event loop only while the worker registry, Redis's memory reading and
the tenant's settings are fresh in the process; had one expired, every submit arriving until it was
read again went to a worker thread and read it there, each on its own. ``Services.refresh_ahead``
reads each again once, off the loop, in the last part of its life. Real redis-server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import pytest

from producer.api.config import ApiConfig
from producer.api.services import RECENT_WORKERS_S, Services
from shared.keys import Keys
from shared.settings import Settings
from shared.tenants import TenantLimits, Tenants
from shared.workers import AgentInfo, WorkerRecord
from tests.harness import RedisServer

TENANT = "ahead"


class Clock:
    """``time.monotonic`` for a test: it moves only when the test moves it, so a cache is exactly as
    old as the test says, however long a loaded machine takes between two lines."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def services(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> Iterator[Services]:
    server = RedisServer().start()
    monkeypatch.setattr(time, "monotonic", clock)
    redis = server.client()
    seconds, _ = redis.time()
    record = WorkerRecord(
        id="w@host",
        host="host",
        pid=1,
        queues=["wesichain"],
        pool="prefork",
        concurrency=1,
        agents=[AgentInfo(name="direct", version="1", model="scripted:x")],
        started_at=float(seconds),
        consuming=True,
        consumer_state="consuming",
    )
    keys = Keys()
    redis.set(keys.worker(record.id), record.model_dump_json())
    redis.zadd(keys.workers(), {record.id: seconds * 1000 + 10_000})  # live for the whole test
    Tenants(redis, keys).set_limits(TENANT, TenantLimits(max_inflight=10))
    svc = Services(ApiConfig(settings=Settings(redis_url=server.url)))
    yield svc
    asyncio.run(svc.close())
    redis.close()
    server.cleanup()


def _read_all(svc: Services) -> None:
    svc.recent_workers()
    svc.client.served("direct")
    svc.client.memory_guard.check()
    svc.gate.limits(TENANT)


def _age(svc: Services, seconds: float) -> None:
    """Make every cache ``seconds`` older than it is: the process's clock moves on."""
    clock = time.monotonic
    assert isinstance(clock, Clock)
    clock.now += seconds


def _all_fresh(svc: Services) -> bool:
    return (
        svc.cached_workers() is not None
        and svc.client.serves_cached("direct")
        and svc.client.memory_guard.fresh()
        and svc.gate.cached(TENANT) is not None
    )


def test_caches_in_the_last_half_of_their_life_are_read_again_once_and_stay_fresh(services: Services) -> None:
    svc = services
    _read_all(svc)

    async def ahead() -> tuple[bool, bool, bool]:
        svc.refresh_ahead(TENANT)
        young = svc._refreshing is None  # just read: nothing to do
        _age(svc, RECENT_WORKERS_S * 0.75)  # past half of the shortest life, not expired
        still_fresh = _all_fresh(svc)
        before = svc._recent_workers[0]
        svc.refresh_ahead(TENANT)
        job = svc._refreshing
        svc.refresh_ahead(TENANT)  # one read at a time
        assert job is not None and svc._refreshing is job
        await job
        await asyncio.sleep(0)  # its done-callback
        return young, still_fresh, svc._recent_workers[0] > before and svc._refreshing is None

    young, still_fresh, refreshed = asyncio.run(ahead())
    assert (young, still_fresh, refreshed) == (True, True, True)
    # Read again: each has its whole life ahead, so a submit stays on the loop for it.
    _age(svc, RECENT_WORKERS_S * 0.75)
    assert _all_fresh(svc)
    assert svc.client.served("direct").name == "direct"


def test_a_failed_read_ahead_is_logged_and_the_next_submit_tries_again(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    svc = services
    _read_all(svc)
    _age(svc, RECENT_WORKERS_S * 0.75)
    live = svc.client.workers.live

    def broken() -> list[object]:
        raise ConnectionError("redis went away")

    svc.client.workers.live = broken  # type: ignore[method-assign,assignment]

    async def ahead() -> None:
        svc.refresh_ahead(TENANT)
        assert svc._refreshing is not None
        await asyncio.gather(svc._refreshing, return_exceptions=True)
        await asyncio.sleep(0)

    with caplog.at_level(logging.WARNING, logger="wesichain.api"):
        asyncio.run(ahead())
    assert svc._refreshing is None
    assert "reading the submit's caches again failed: redis went away" in caplog.text
    # The caches answer as before until they expire; the next submit reads them again.
    assert svc.cached_workers() is not None
    svc.client.workers.live = live  # type: ignore[method-assign]
    started = time.monotonic()
    asyncio.run(ahead())
    assert svc._recent_workers[0] >= started
