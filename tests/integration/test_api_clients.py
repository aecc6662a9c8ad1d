"""The Python clients of the HTTP API (AsyncClient, ApiClient) and the CLI's API mode, against a
real uvicorn process, real workers and a real redis-server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator

import pytest

from producer.api_client import ApiClient, AsyncClient, RateLimited
from producer.client import Client, RequestConflict, RunNotFound, UnknownAgent
from shared.events import Event
from shared.keys import Keys
from shared.state import Phase
from shared.tenants import Tenants
from tests.api_support import ApiProcess
from tests.broker import Settings
from tests.conftest import InProcessCli
from tests.harness import ROOT, RedisServer, WorkerProcess, wait_until

TIMEOUT = 60


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, workers: list[WorkerProcess]) -> Iterator[ApiProcess]:
    process = ApiProcess(redis_server.url, env={"WESICHAIN_API_KEEPALIVE_S": "1"}).start()
    yield process
    process.stop()


@pytest.fixture
def key(redis_server: RedisServer) -> str:
    created, _ = Tenants(redis_server.client(), Keys()).create_key(f"cl-{uuid.uuid4().hex[:8]}")
    return created


def redis_events(redis_server: RedisServer, run_id: str) -> list[tuple[str | None, str]]:
    client = Client(Settings(redis_url=redis_server.url))
    try:
        return [(e.stream_id, e.kind) for e in client.handle(run_id).events(follow=False)]
    finally:
        client.close()


def followed_across_a_restart(own: ApiProcess, events: Iterator[Event]) -> list[Event]:
    """Read ``events`` (of a ``slow_step`` run) on a thread; SIGKILL the API process once its tool
    is dispatched and start it again; return every event read, once the iterator has ended."""
    received: list[Event] = []
    dispatched = threading.Event()

    def follow() -> None:
        for event in events:
            received.append(event)
            if event.kind == "ToolDispatched":
                dispatched.set()

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    assert dispatched.wait(TIMEOUT)
    own.kill()
    own.start()
    follower.join(TIMEOUT)
    assert not follower.is_alive()
    return received


def test_async_client_submits_follows_and_decides(
    api: ApiProcess, redis_server: RedisServer, key: str
) -> None:
    async def scenario() -> tuple[str, list[Event], Phase, str]:
        async with AsyncClient(api.url, key) as client:
            handle = await client.submit("one_hop", "1+2", idempotency_key="async-1", metadata={"n": 1})
            again = await client.submit("one_hop", "1+2", idempotency_key="async-1", metadata={"n": 1})
            assert again.run_id == handle.run_id
            with pytest.raises(RequestConflict):
                await client.submit("one_hop", "other", idempotency_key="async-1")
            events = [e async for e in handle.events()]
            head = await handle.wait(TIMEOUT)
            assert (await client.list_runs(limit=5)).runs[0].run_id == handle.run_id
            assert "one_hop" in {a.name for a in await client.agents()}
            with pytest.raises(RunNotFound):
                await client.handle("no-such-run").status()
            with pytest.raises(UnknownAgent):
                await client.submit("nobody_serves_this", "x")
            parked = await client.submit("needs_approval", "refund")
            async for event in parked.events():
                if event.kind == "AwaitingApproval":
                    await parked.approve("fine")
            decided = await parked.wait(TIMEOUT)
            assert len(await parked.checkpoints()) == decided.version
            return handle.run_id, events, head.phase, decided.answer or ""

    run_id, events, phase, answer = asyncio.run(scenario())
    assert phase is Phase.COMPLETED and answer.startswith("charged")
    # The same events, with the same stream ids, as the Redis client reads.
    assert [(e.stream_id, e.kind) for e in events] == redis_events(redis_server, run_id)


def test_sync_client_resumes_a_stream_across_an_api_restart(
    redis_server: RedisServer, workers: list[WorkerProcess], key: str
) -> None:
    """The API process is SIGKILLed mid-stream and started again: the client resumes after the last
    event it received, and gets every event exactly once. (Its own API process, on the module's
    workers: run first, it must wait for them as the module's API does.)"""
    own = ApiProcess(redis_server.url).start()
    try:
        with ApiClient(own.url, key) as client:
            handle = client.submit("slow_step", "wait for it")
            received = followed_across_a_restart(own, handle.events())
            assert handle.status().phase is Phase.COMPLETED
    finally:
        own.stop()
    assert received[-1].kind == "Completed"
    assert [(e.stream_id, e.kind) for e in received] == redis_events(redis_server, handle.run_id)


def test_cli_works_against_the_api(api: ApiProcess, key: str, cli_in_process: InProcessCli) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WESICHAIN_API_KEY": key}
    env.pop("WESICHAIN_REDIS_URL", None)
    # The installed entry point, once: a process of its own submits and follows the run.
    submitted = subprocess.run(
        [
            sys.executable,
            "-m",
            "producer.cli",
            "submit",
            "direct",
            "hello",
            "--api",
            api.url,
            "--wait",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=env,
    )
    assert submitted.returncode == 0, submitted.stderr
    lines = [json.loads(line) for line in submitted.stdout.splitlines()]
    assert lines[-1]["answer"] == "The answer is 42." and lines[-2]["kind"] == "Completed"
    run_id = lines[-1]["run_id"]

    # The other commands in this process, the API's URL and key from the environment as above.
    over_api = {"WESICHAIN_API_KEY": key, "WESICHAIN_API_URL": api.url, "WESICHAIN_REDIS_URL": None}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return cli_in_process(*args, env=over_api)

    status = cli("status", run_id, "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["phase"] == "completed"
    events = cli("events", run_id, "--json")
    assert [json.loads(line)["kind"] for line in events.stdout.splitlines()] == [
        line["kind"] for line in lines[:-1]
    ]
    agents = json.loads(cli("agents", "--json").stdout)
    assert "direct" in {a["name"] for a in agents}
    missing = cli("status", "no-such-run")
    assert missing.returncode == 1 and "no run" in missing.stderr
    wrong_key = cli("status", run_id, "--key", "wsk_wrong")
    assert wrong_key.returncode == 2 and "unauthorized" in wrong_key.stderr
    assert cli("submit", "direct", "x", "--no-check").returncode == 2


def test_a_run_over_the_api_can_be_followed_by_redis_clients_too(
    api: ApiProcess, redis_server: RedisServer, key: str
) -> None:
    with ApiClient(api.url, key) as client:
        handle = client.submit("direct", "x")
        head = handle.wait(TIMEOUT)
        assert head.answer == "The answer is 42." and head.tenant is None  # the API does not show it
        wait_until(lambda: redis_events(redis_server, handle.run_id), timeout=TIMEOUT)
        page = [(e.stream_id, e.kind) for e in handle.events(follow=False)]
        assert page == redis_events(redis_server, handle.run_id)


def test_submit_and_follow_resumes_its_one_request_across_an_api_restart(
    redis_server: RedisServer, workers: list[WorkerProcess], key: str
) -> None:
    """A run submitted and followed in one request: the API process is SIGKILLed mid-stream and
    started again, and the client resumes the run's stream after the last event it received."""
    own = ApiProcess(redis_server.url).start()
    try:
        with ApiClient(own.url, key) as client:
            with pytest.raises(UnknownAgent):
                next(client.submit_and_follow("no-such-agent", "x"))
            followed = client.submit_and_follow("slow_step", "wait for it", idempotency_key="saf-1")
            received = followed_across_a_restart(own, followed)
            run_id = received[0].run_id
            assert client.handle(run_id).status().phase is Phase.COMPLETED
            assert [r.run_id for r in client.list_runs().runs] == [run_id]
    finally:
        own.stop()
    assert received[0].kind == "RunStarted" and received[-1].kind == "Completed"
    assert {e.run_id for e in received} == {run_id}
    assert [(e.stream_id, e.kind) for e in received] == redis_events(redis_server, run_id)


def test_async_client_submits_and_follows_in_one_request(
    api: ApiProcess, redis_server: RedisServer, key: str
) -> None:
    async def scenario() -> list[Event]:
        async with AsyncClient(api.url, key) as client:
            with pytest.raises(UnknownAgent):
                async for _ in client.submit_and_follow("no-such-agent", "x"):
                    pass
            return [e async for e in client.submit_and_follow("one_hop", "1+2", metadata={"n": 1})]

    events = asyncio.run(scenario())
    assert events[0].kind == "RunStarted" and events[-1].kind == "Completed"
    run_id = events[0].run_id
    assert [(e.stream_id, e.kind) for e in events] == redis_events(redis_server, run_id)


def test_submit_and_follow_ends_when_idle_or_left_and_gives_its_stream_place_back(
    redis_server: RedisServer, workers: list[WorkerProcess], key: str
) -> None:
    """Following ends after ``idle_timeout`` without an event (the keep-alives of a parked run's
    stream are no events), or when the caller stops reading: either way the request is closed and
    the tenant's one stream place is free again."""
    env = {"WESICHAIN_API_MAX_STREAMS_PER_TENANT": "1", "WESICHAIN_API_KEEPALIVE_S": "0.2"}
    own = ApiProcess(redis_server.url, env=env).start()
    try:
        with ApiClient(own.url, key) as client:

            def place_free() -> bool:
                try:
                    return [e.kind for e in client.submit_and_follow("direct", "x")][-1] == "Completed"
                except RateLimited:
                    return False  # its place still held: refused, and no run started

            for event in client.submit_and_follow("needs_approval", "left"):
                assert event.kind == "RunStarted"
                break  # the iterator dropped: its request is closed
            wait_until(place_free, timeout=TIMEOUT, what="the place of a stream left to be given back")
            followed: list[Event] = []

            def follow() -> None:
                followed.extend(client.submit_and_follow("needs_approval", "idle", idle_timeout=1))

            follower = threading.Thread(target=follow, daemon=True)
            follower.start()
            wait_until(lambda: not follower.is_alive(), timeout=TIMEOUT, what="following to end once idle")
            assert followed[0].kind == "RunStarted" and followed[-1].kind == "AwaitingApproval"
            wait_until(place_free, timeout=TIMEOUT, what="the place of an idle stream to be given back")

            async def left_async() -> str:
                async with AsyncClient(own.url, key) as aclient:
                    run_id = ""
                    async for event in aclient.submit_and_follow("needs_approval", "left async"):
                        run_id = event.run_id
                        break
                    # The iterator dropped: its request is closed, and its place given back.
                    await asyncio.to_thread(wait_until, place_free, TIMEOUT)
                    return run_id

            left_run = asyncio.run(left_async())
            runs = {r.run_id for r in client.list_runs().runs}
            # Three parked runs, three followed to their end (each once its place was free).
            assert len(runs) == 6 and {followed[0].run_id, left_run} < runs
    finally:
        own.stop()
