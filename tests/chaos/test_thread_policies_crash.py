"""Thread policies under faults: 20 messages at once on a busy thread while the busy run's worker
is SIGKILLed, a kill between a run's ending commit and the hand-on of its thread, and a Redis
restart (AOF, fsync always) while runs wait for their thread.

The outcomes are the documented ones (docs/agents.md, "Threads and a second message"), asserted
exactly: order, statuses, histories, a non-retry-safe tool at most once, nothing left parked.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from producer.client import Client
from shared.errors import ThreadBusy
from shared.messages import AssistantMessage, Message, SystemMessage, ToolMessage, UserMessage
from shared.state import Phase, RunHead, ThreadPolicy
from tests.agents_fixture import GATE_DIR_ENV
from tests.broker import Settings
from tests.chaos.faults import fired_key
from tests.chaos.support import (
    RUN_TIMEOUT_S,
    Cluster,
    effects,
    idem,
    kill_child,
    note_recovery,
    outage,
    starts,
    wait_paused,
)
from tests.harness import RedisServer, wait_thread_free, wait_until

AGENTS = "tests.agents_threads"
SUBMITS = 20


@pytest.fixture
def threads_client(server: RedisServer) -> Iterator[Client]:
    c = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    yield c
    c.close()


def _spare(client: Client, fault: str, run_ids: list[str]) -> None:
    """The fault fires once per run: mark it fired for these runs, so it hits only the busy one."""
    for run_id in run_ids:
        client.store.redis.set(fired_key(fault, run_id), "spared", ex=3600)


def _ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i}-{uuid.uuid4().hex[:8]}" for i in range(n)]


def _submit_at_once(client: Client, thread: str, policy: ThreadPolicy, ids: list[str]) -> list[str]:
    """Submit every run of ``ids`` concurrently on the thread (agent ``echo``); each one's outcome."""

    def one(run_id: str) -> str:
        try:
            client.submit("echo", f"message {run_id}", thread_id=thread, run_id=run_id, thread_policy=policy)
        except ThreadBusy as busy:
            return f"busy:{busy.run_id}"
        return "ok"

    with ThreadPoolExecutor(len(ids)) as pool:
        return list(pool.map(one, ids))


def _order(client: Client, thread: str) -> list[str]:
    return [str(r) for r in client.store.redis.lrange(client.store.keys.thread(None, thread), 0, -1)]


def _conversation(client: Client, run_id: str) -> list[Message]:
    return [m for m in client.store.load_messages(run_id) if not isinstance(m, SystemMessage)]


def _wait_parked(client: Client, run_id: str) -> None:
    wait_until(lambda: client.store.thread_wait(run_id), RUN_TIMEOUT_S, what=f"run {run_id} to park")


def _assert_nothing_stranded(client: Client, thread: str, run_ids: list[str]) -> None:
    """The thread is free, nobody waits for it, and no run is left parked.

    The last run's hand-on of its thread follows its terminal commit (a step of its own, that the
    sweeper repairs when a kill falls between them), so a caller that saw the run end may look
    before the thread is released: it is waited for, then everything is asserted."""
    wait_thread_free(client.store, thread, RUN_TIMEOUT_S)
    assert client.store.thread_waiting(None, thread) == []
    assert [r for r in run_ids if client.store.thread_wait(r) is not None] == []


def _assert_chained(client: Client, first_input: str, heads: list[RunHead]) -> None:
    """Each run continued the conversation of the one before it: its own question and answer last,
    the previous run's question just before them."""
    previous_input = first_input
    for head in heads:
        conversation = _conversation(client, head.run_id)
        assert [type(m) for m in conversation[-2:]] == [UserMessage, AssistantMessage]
        assert conversation[-2].content == head.input
        earlier_users = [m.content for m in conversation[:-2] if isinstance(m, UserMessage)]
        assert earlier_users[-1] == previous_input
        previous_input = head.input


@pytest.mark.parametrize(
    ("policy", "killed_in"),
    [("enqueue", "acting"), ("reject", "thinking"), ("interrupt", "acting"), ("rollback", "thinking")],
)
def test_twenty_messages_on_a_thread_whose_busy_run_loses_its_worker(
    cluster: Cluster, threads_client: Client, policy: ThreadPolicy, killed_in: str
) -> None:
    """The busy run (``thread_steps``: a retry-safe look, a non-retry-safe charge, an answer) is
    paused in its first think or its first tool; 20 runs are submitted at once on its thread; the
    paused worker process is SIGKILLed. Everything ends as documented for the policy."""
    fault = f"pause:{killed_in}"
    workers = cluster.start(2, concurrency=2, agents=AGENTS, env={"WESICHAIN_FAULT": fault})
    client = threads_client
    r = client.store.redis
    thread = f"{policy}-{uuid.uuid4().hex}"
    kept, after = _ids("kept", 1), _ids("after", 1)
    ids = _ids(policy, SUBMITS)
    _spare(client, fault, kept + after + ids)
    if policy == "rollback":  # a run before the busy one, whose exchange stays in the thread
        client.submit("echo", "the kept question", thread_id=thread, run_id=kept[0])
        assert client.handle(kept[0]).wait(RUN_TIMEOUT_S).phase is Phase.COMPLETED
    busy = client.submit("thread_steps", "go", thread_id=thread)
    pid = wait_paused(r, killed_in, busy.run_id)

    outcomes = _submit_at_once(client, thread, policy, ids)

    if policy == "reject":
        assert outcomes == [f"busy:{busy.run_id}"] * SUBMITS
        assert [client.store.load(run_id) for run_id in ids] == [None] * SUBMITS
    else:
        assert outcomes == ["ok"] * SUBMITS
    before = kept if policy == "rollback" else []
    order = _order(client, thread)[len(before) + 1 :]
    assert sorted(order) == (sorted(ids) if policy != "reject" else [])
    if policy == "enqueue":
        for run_id in order:  # each parked, without a worker, behind the one before it
            _wait_parked(client, run_id)
    if policy in ("interrupt", "rollback"):
        # A cancelled run that waited for its thread ends at once, without running: before the
        # busy run itself, which is still paused.
        for run_id in order[:-1]:
            assert client.handle(run_id).wait(RUN_TIMEOUT_S).phase is Phase.INTERRUPTED
        assert busy.status().phase is (Phase.ACTING if killed_in == "acting" else Phase.THINKING)

    killed_at = time.time()
    kill_child(pid, cluster.owner(pid))
    busy_head = busy.wait(RUN_TIMEOUT_S)
    note_recovery(f"thread {policy}: worker killed in {killed_in}", time.time() - killed_at)
    heads = [client.handle(run_id).wait(RUN_TIMEOUT_S) for run_id in order]

    look, pay = idem(busy.run_id, 1), idem(busy.run_id, 2)
    if policy in ("enqueue", "reject"):
        assert busy_head.phase is Phase.COMPLETED, busy_head.error
        assert busy_head.answer == "charged"
        # Paused before the tool body ran, the look ran once, on the worker it was handed to;
        # the charge, never in doubt, once.
        assert (starts(r, look), effects(r, look), starts(r, pay), effects(r, pay)) == (1, 1, 1, 1)
    else:
        # Asked to stop, it stopped at the first boundary after the kill: the charge never ran.
        assert busy_head.phase is Phase.INTERRUPTED
        assert (starts(r, look), starts(r, pay)) == (0, 0)

    if policy == "enqueue":
        assert [h.phase for h in heads] == [Phase.COMPLETED] * SUBMITS
        # The first saw the busy run's whole exchange: two tool results, six messages, its own.
        assert heads[0].answer == "seen 2 tool results in 8 messages"
        _assert_chained(client, "go", heads)
    elif policy == "reject":
        assert heads == []
        free = client.submit("echo", "and now?", thread_id=thread, thread_policy="reject", run_id=after[0])
        assert free.wait(RUN_TIMEOUT_S).answer == "seen 2 tool results in 8 messages"
    else:
        assert [h.phase for h in heads] == [Phase.INTERRUPTED] * (SUBMITS - 1) + [Phase.COMPLETED]
        assert [h.message_count for h in heads[:-1]] == [0] * (SUBMITS - 1)
        conversation = _conversation(client, order[-1])
        if policy == "interrupt":
            # The busy run's kept history, its look answered by what was recorded for it: the
            # handed-on call found the run cancelled and did not start.
            assert [type(m) for m in conversation] == [
                UserMessage,
                AssistantMessage,
                ToolMessage,
                UserMessage,
                AssistantMessage,
            ]
            result = conversation[2]
            assert isinstance(result, ToolMessage) and result.is_error
            assert "cancelled before the tool started" in result.content
            assert heads[-1].answer == "seen 1 tool results in 5 messages"
        else:
            assert client.store.rolled_back(None, thread) == {busy.run_id, *order[:-1]}
            users = [m.content for m in conversation if isinstance(m, UserMessage)]
            assert users == ["the kept question", heads[-1].input]
            assert heads[-1].answer == "seen 0 tool results in 4 messages"
    _assert_nothing_stranded(client, thread, [busy.run_id, *order])
    assert all(w.alive for w in workers)  # only a pool process was killed


def test_a_kill_between_a_runs_ending_commit_and_its_hand_on_is_repaired_by_the_sweeper(
    cluster: Cluster, threads_client: Client, tmp_path: Path
) -> None:
    """The busy run's process is SIGKILLed right after the commit that completed it, before it
    handed the thread on: the sweeper's ``repair_threads`` hands it on and wakes the next run."""
    fault = "crash_after_commit:ended"
    workers = cluster.start(2, agents=AGENTS, env={"WESICHAIN_FAULT": fault, GATE_DIR_ENV: str(tmp_path)})
    client = threads_client
    r = client.store.redis
    thread = f"handon-{uuid.uuid4().hex}"
    waiting = _ids("w", 3)
    _spare(client, fault, waiting)
    busy = client.submit("thread_look", "look", thread_id=thread)
    wait_until(lambda: busy.status().phase is Phase.ACTING, RUN_TIMEOUT_S, what="the look to run")
    for run_id in waiting:
        client.submit("echo", f"message {run_id}", thread_id=thread, run_id=run_id, thread_policy="enqueue")
    for run_id in waiting:
        _wait_parked(client, run_id)
    (tmp_path / "open").touch()

    assert busy.wait(RUN_TIMEOUT_S).phase is Phase.COMPLETED
    ended_at = time.time()
    crashed = int(wait_until(lambda: r.get(fired_key(fault, busy.run_id)), RUN_TIMEOUT_S, what="the kill"))
    first = client.handle(waiting[0])
    wait_until(lambda: first.status().phase is not Phase.IDLE, RUN_TIMEOUT_S, what="the next run to start")
    note_recovery("thread hand-on lost: next run started", time.time() - ended_at)
    heads = [client.handle(run_id).wait(RUN_TIMEOUT_S) for run_id in waiting]

    assert [h.phase for h in heads] == [Phase.COMPLETED] * 3
    _assert_chained(client, "look", heads)
    # The process that committed the end died before the hand-on: the sweeper did it.
    wait_until(lambda: all(crashed not in w.pids() for w in workers), 10, what="the killed process to go")
    logs = "".join(w.log() for w in workers)
    assert f"thread {thread}: handed on from run {busy.run_id} (its hand-on was lost)" in logs
    _assert_nothing_stranded(client, thread, [busy.run_id, *waiting])


@pytest.mark.standalone_redis  # stops and restarts its Redis
def test_a_threads_queue_survives_a_redis_restart(
    aof_cluster: Cluster, aof_server: RedisServer, tmp_path: Path
) -> None:
    """Five runs wait behind a busy one; Redis (AOF, fsync always) is stopped and started again:
    the thread's holder, its queue and each run's park are all there, and the runs complete in order."""
    workers = aof_cluster.start(2, concurrency=2, agents=AGENTS, env={GATE_DIR_ENV: str(tmp_path)})
    client = Client(Settings(redis_url=aof_server.url, agents_module=AGENTS))
    try:
        thread = f"aof-{uuid.uuid4().hex}"
        busy = client.submit("thread_look", "look", thread_id=thread)
        wait_until(lambda: busy.status().phase is Phase.ACTING, RUN_TIMEOUT_S, what="the look to run")
        waiting = _ids("aof", 5)
        for run_id in waiting:
            client.submit("echo", f"message {run_id}", thread_id=thread, run_id=run_id)
        for run_id in waiting:
            _wait_parked(client, run_id)
        parks = {run_id: client.store.thread_wait(run_id) for run_id in waiting}

        outage(aof_server, workers)
        aof_cluster.revive(wait=True)

        # Nothing ended meanwhile (the gate is closed): the thread is exactly as it was.
        assert client.store.thread_holder(None, thread)[0] == busy.run_id
        assert client.store.thread_waiting(None, thread) == waiting
        assert {run_id: client.store.thread_wait(run_id) for run_id in waiting} == parks
        (tmp_path / "open").touch()
        assert busy.wait(RUN_TIMEOUT_S).phase is Phase.COMPLETED
        heads = [client.handle(run_id).wait(RUN_TIMEOUT_S) for run_id in waiting]
        assert [h.phase for h in heads] == [Phase.COMPLETED] * 5
        assert _order(client, thread) == [busy.run_id, *waiting]
        _assert_chained(client, "look", heads)
        _assert_nothing_stranded(client, thread, [busy.run_id, *waiting])
    finally:
        client.close()
