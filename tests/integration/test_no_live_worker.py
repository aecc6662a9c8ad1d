"""A submit while no live worker is known is a retryable refusal, never the permanent one of an
agent nothing serves; and a worker is listed again the moment Redis answers after losing its record.

Real parts: redis-servers of the tests' own (one restarted), a real worker process, the HTTP API
process, and the worker's registry thread against a restarted Redis.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import redis

from producer.api_client import ApiClient
from producer.client import Client, NoLiveWorker, UnknownAgent
from shared.errors import InvalidRequest
from shared.keys import Keys
from shared.redis_client import connect
from shared.state import Phase
from shared.store import RunStore
from shared.tenants import Tenants
from tests.agents_fixture import registry as fixture_agents
from tests.api_support import ApiProcess, bearer
from tests.broker import Settings
from tests.harness import RedisServer, WorkerProcess, running, wait_until
from worker.registry import RegistryBeat

pytestmark = pytest.mark.standalone_redis  # restarts its own Redis

TIMEOUT = 30


@pytest.fixture
def server() -> Iterator[RedisServer]:
    server = RedisServer(appendonly=True).start()
    yield server
    server.cleanup()


@pytest.fixture
def client(server: RedisServer) -> Iterator[Client]:
    client = Client(Settings(redis_url=server.url, agents_module="tests.agents_fixture"))
    yield client
    client.close()


def test_no_worker_known_is_retryable_and_a_misspelled_agent_is_not(
    server: RedisServer, client: Client, tmp_path: Any
) -> None:
    key, _ = Tenants(client.store.redis, client.store.keys).create_key("acme")
    api = ApiProcess(server.url).start()
    try:
        with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
            # No worker registered (as for a moment after a Redis restart): retry, not a bad request.
            with pytest.raises(NoLiveWorker, match="no live worker is known right now") as refused:
                client.submit("direct", "hi")
            assert not isinstance(refused.value, InvalidRequest)
            answer = http.post("/v1/runs", json={"agent": "direct", "input": "hi"})
            assert answer.status_code == 503, answer.text
            assert answer.headers["retry-after"] == "1"
            assert answer.json()["error"]["kind"] == "no_live_worker"
            with ApiClient(api.url, key) as over_http, pytest.raises(NoLiveWorker) as refused_http:
                over_http.submit("direct", "hi")
            assert refused_http.value.retry_after_s == 1.0
            assert client.list_runs(limit=10).runs == []  # nothing was created

            worker = WorkerProcess("nlw", server.url, log_dir=str(tmp_path))
            with running([worker]):
                wait_until(
                    lambda: "direct" in client.workers.agents(), TIMEOUT, what="the worker to register"
                )
                # Workers are live and none serves it: the permanent refusal.
                with pytest.raises(UnknownAgent, match="no live worker serves agent 'drect'"):
                    client.submit("drect", "hi")
                answer = http.post("/v1/runs", json={"agent": "drect", "input": "hi"})
                assert answer.status_code == 422 and answer.json()["error"]["kind"] == "unknown_agent"
                assert "retry-after" not in answer.headers
                # And the agent they serve is accepted.
                answer = http.post("/v1/runs", json={"agent": "direct", "input": "hi"})
                assert answer.status_code == 202, answer.text
    finally:
        api.stop()


def test_submits_across_a_redis_restart_are_refused_only_as_retryable(
    server: RedisServer, client: Client, tmp_path: Any
) -> None:
    """Redis restarted with the registry gone (as when the records expired during the outage):
    until the worker is listed again, a submit is refused as retryable, never as an unknown agent,
    and once it is, the run is accepted and completes."""
    worker = WorkerProcess("nlw-restart", server.url, log_dir=str(tmp_path))
    with running([worker]):
        wait_until(lambda: "one_hop" in client.workers.agents(), TIMEOUT, what="the worker to register")
        offset = len(worker.log())
        server.stop()
        wait_until(lambda: "Cannot connect" in worker.log()[offset:], TIMEOUT, what="the worker to notice")
        server.start()
        # The records would have expired in a longer outage: gone, as they would be.
        r = server.client()
        r.delete(client.store.keys.workers(), *r.keys(client.store.keys.worker("*")))
        refusals: list[Exception] = []

        def accepted() -> str | None:
            try:
                return client.submit("one_hop", "after the restart").run_id
            except NoLiveWorker as exc:
                refusals.append(exc)
            except redis.ConnectionError:
                pass  # the client's own connection to the restarted server
            return None

        run_id = wait_until(accepted, TIMEOUT, interval=0.1, what="a submit to be accepted")
        head = client.handle(run_id).wait(TIMEOUT)
        assert head.phase is Phase.COMPLETED and head.answer == "1 + 2 = 3"
        assert all(type(e) is NoLiveWorker for e in refusals)


class _Consumer:
    """A consumer with no broker connection: the record says it is not consuming."""


def test_the_registry_writes_its_record_again_at_once_when_redis_lost_it(server: RedisServer) -> None:
    """With an interval far longer than the test waits, the registry thread re-registers as soon
    as its record is gone, and as soon as a restarted Redis answers again."""
    settings = Settings(redis_url=server.url, agents_module="tests.agents_fixture")
    rt: Any = SimpleNamespace(
        store=RunStore(connect(settings), settings), agents=fixture_agents, settings=settings
    )
    beat = RegistryBeat(rt, _Consumer(), interval_s=600)
    keys = Keys()
    r = server.client()

    def listed() -> bool:
        return (
            bool(r.exists(keys.worker(beat.worker_id)))
            and r.zscore(keys.workers(), beat.worker_id) is not None
        )

    beat.start()
    try:
        wait_until(listed, TIMEOUT, what="the first beat")
        r.delete(keys.worker(beat.worker_id), keys.workers())  # expired, as in an outage
        wait_until(listed, TIMEOUT, what="the record to be written again")
        server.stop()
        server.start()  # an AOF restart keeps it: take it away again while Redis is down
        r = server.client()
        r.delete(keys.worker(beat.worker_id), keys.workers())
        wait_until(listed, TIMEOUT, what="the record to be written again after the restart")
    finally:
        beat.stop()
    assert not listed()  # a stopped worker leaves the registry
