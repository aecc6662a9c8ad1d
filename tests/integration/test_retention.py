"""Retention and a full Redis, on a real redis-server.

``wesichain gc`` finds what outlived the retention (runs that would never expire, orphaned keys,
index entries of runs that are gone or too old) and removes it, and only it; a Redis near its
``maxmemory`` (``noeviction``) refuses new runs with a clear error while real workers finish the
runs already going.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from producer.cli import main
from producer.client import Client
from shared.errors import StoreFull
from shared.llm.base import Usage
from shared.retention import GarbageCollector
from shared.state import Phase
from shared.store import RunStore
from tests.broker import Settings
from tests.harness import RedisServer, WorkerProcess, wait_until
from tests.store_support import make_store
from worker.testing.runs import commit, started


@pytest.fixture
def rds(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


def _completed(store: RunStore) -> str:
    thinking = started(store)
    commit(store, thinking, thinking.complete("done", Usage()))
    return thinking.head.run_id


def _keys_of(store: RunStore, run_id: str) -> list[str]:
    run_key = store.keys.run(run_id)
    return [run_key, *store.redis.scan_iter(match=run_key.replace("{", "\\{").replace("}", "\\}") + ":*")]


def test_gc_removes_what_outlived_the_retention_and_nothing_else(rds: redis.Redis) -> None:
    store = make_store(rds)  # retention 3600 s
    k = store.keys
    on_time = _completed(store)  # ended, expiring as it should
    live = started(store).head.run_id  # still thinking
    old = _completed(store)  # ended 10 days ago and would never expire
    recent = _completed(store)  # ended just now and would never expire
    gone = _completed(store)  # its keys expired; its index entries did not
    orphan = _completed(store)  # its head is gone; its messages would never expire
    for run_id in (old, recent, orphan):
        for key in _keys_of(store, run_id):
            rds.persist(key)
    head = json.loads(rds.hget(k.run(old), "body") or "{}")
    head["updated_at"] = time.time() - 10 * 86400
    rds.hset(k.run(old), "body", json.dumps(head))
    for key in _keys_of(store, gone):
        rds.delete(key)
    rds.delete(k.run(orphan))
    ancient = k.index_of("ancient", None)  # a listing entry created before the retention
    rds.zadd(ancient, {"ancient": 1000})
    rds.sadd(k.indexes_of("ancient"), ancient)

    def entries(run_id: str) -> int:
        """Index entries naming ``run_id``: the listing indexes, the run index and the ended set."""
        keys = [key for shard in range(k.shards) for key in rds.smembers(k.indexes(shard))]
        keys += [k.runs_index(shard) for shard in range(k.shards)]
        keys += [k.ended(shard) for shard in range(k.shards)]
        return sum(1 for key in keys if rds.zscore(key, run_id) is not None)

    gone_entries, orphan_entries, old_entries = entries(gone), entries(orphan), entries(old)
    assert gone_entries == 5  # all runs, by agent, by status; the run index; the ended set

    collector = GarbageCollector(rds, store.settings)
    dry = collector.collect(dry_run=True)
    # The orphan's messages, checkpoints, events and attempts.
    assert (dry.expired_runs, dry.runs_given_ttl, dry.orphan_keys) == (1, 1, 4)
    assert dry.runs_expiring == 1 and dry.live_runs == 1
    assert dry.index_entries_past_retention == 1
    assert dry.index_entries_of_gone_runs == gone_entries + orphan_entries
    assert dry.bytes_freed > 0
    assert rds.exists(k.run(old)) and rds.ttl(k.run(recent)) == -1  # a dry run changes nothing

    done = collector.collect()
    assert (done.expired_runs, done.runs_given_ttl, done.orphan_keys) == (1, 1, 4)
    # ... and the entries of the run this pass removed.
    assert done.index_entries_of_gone_runs == gone_entries + orphan_entries + old_entries
    assert not any(rds.exists(key) for key in _keys_of(store, old))
    assert all(0 < rds.ttl(key) <= 3600 for key in _keys_of(store, recent))
    assert not any(
        rds.exists(key)
        for key in (k.messages(orphan), k.checkpoints(orphan), k.events(orphan), k.attempts(orphan))
    )
    assert store.load(on_time) is not None and store.load(live) is not None and store.load(recent) is not None
    listed = {h.run_id for h in store.list_runs(None, limit=100).runs}
    assert listed == {on_time, live, recent}

    again = collector.collect()
    assert (again.expired_runs, again.runs_given_ttl, again.orphan_keys) == (0, 0, 0)
    assert again.index_entries_of_gone_runs == 0 and again.index_entries_past_retention == 0


def test_a_full_redis_refuses_new_runs_while_running_runs_finish(tmp_path: Any) -> None:
    server = RedisServer().start()
    worker = WorkerProcess("full", server.url, pool="threads", concurrency=4, log_dir=str(tmp_path))
    worker.start()
    client = Client(Settings(redis_url=server.url, agents_module="tests.agents_fixture"))
    admin = server.client()
    try:
        running = [client.submit("slow_step", f"slow {i}") for i in range(2)]  # a 3 s tool each
        wait_until(
            lambda: all(h.status().phase is Phase.ACTING for h in running),
            timeout=30,
            what="the tools to run",
        )
        # Inert bulk first: every connection opened from here on (the late client's, the worker's
        # threads') costs Redis some 20-100 KB, which must stay small against the 7% of headroom
        # left below, or the running runs' own commits would hit maxmemory on a Redis this small
        # (and how small it is depends on the broker: the Redis broker's connections and keys add
        # to it, RabbitMQ's do not).
        # (In pieces: one 8 MB command would count in Redis's memory as its query buffer for a
        # while, and the maxmemory below would then be twice too large once that is freed.)
        for _ in range(64):
            admin.append("test:ballast", b"\0" * 131_072)
        used = int(admin.info("memory")["used_memory"])
        admin.config_set("maxmemory", int(used / 0.93))  # above the 90% at which submits stop
        assert admin.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        # (A client looks at Redis's memory at most once a second: a new one sees it at once.)
        late = Client(Settings(redis_url=server.url, agents_module="tests.agents_fixture"))
        with pytest.raises(StoreFull, match="Redis is full: it uses .* new runs are refused from 90%"):
            late.submit("direct", "one more")
        # The late client's connections stay open until the CLI has been refused too: closed
        # before, they would give Redis back about as much memory as the 3% between 93% and the
        # 90% that refuses, and the CLI's submit could find room.
        assert main(["submit", "--redis", server.url, "--agents", "tests.agents_fixture", "direct", "x"]) == 2
        late.close()
        assert [h.wait(timeout=60).phase for h in running] == [Phase.COMPLETED, Phase.COMPLETED]
        assert store_runs(client) == 2  # the refused submits created nothing
        admin.config_set("maxmemory", 0)
        assert client.submit("direct", "room again").wait(timeout=30).phase is Phase.COMPLETED
    finally:
        worker.stop()
        client.close()
        admin.close()
        server.cleanup()


def store_runs(client: Client) -> int:
    return len(client.list_runs(limit=100).runs)
