"""A second message on a busy thread, under each thread policy, on real workers and a real Redis.

The documented outcomes (docs/agents.md, "Threads and a second message"), asserted exactly: a
blocker run of the thread is inside a non-retry-safe tool call that ends only when the test opens
its gate, 20 runs are submitted at once on the thread, then the gate opens.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from producer.client import Client, RunHandle
from shared.errors import ThreadBusy
from shared.messages import AssistantMessage, Message, SystemMessage, ToolMessage, UserMessage
from shared.state import Phase, ThreadPolicy
from tests.agents_fixture import GATE_DIR_ENV
from tests.conftest import own_store
from tests.harness import RedisServer, WorkerProcess, running, wait_thread_free, wait_until
from tests.redis_cluster import RedisCluster

TIMEOUT = 60
SUBMITS = 20


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate")


@pytest.fixture(scope="module")
def redis_server(redis_cluster: RedisCluster | None) -> Iterator[RedisServer]:
    """This module's own run-state Redis: the session's shared workers, which have no gate, must
    not take the gated charge of these tests (the ``client`` fixture uses this one too)."""
    with own_store(redis_cluster) as server:
        yield server


@pytest.fixture(scope="module")
def gated_workers(redis_server: RedisServer, gate: Path) -> Iterator[list[WorkerProcess]]:
    pool = [
        WorkerProcess(f"tp{i}", redis_server.url, concurrency=2, env={GATE_DIR_ENV: str(gate)})
        for i in (1, 2)
    ]
    with running(pool) as started:
        yield started


def _count(gate: Path, name: str) -> int:
    path = gate / name
    return len(path.read_text().splitlines()) if path.exists() else 0


def _blocked(client: Client, gate: Path, thread: str) -> RunHandle:
    """A run of the thread inside its gated, non-retry-safe charge (the gate closed)."""
    (gate / "open").unlink(missing_ok=True)
    blocker = client.submit("thread_charge", "charge me", thread_id=thread)
    key = f"{blocker.run_id}:1:call_0"
    wait_until(lambda: _count(gate, f"{key}.starts") == 1, TIMEOUT, what="the charge to start")
    return blocker


def _submit_at_once(client: Client, thread: str, policy: ThreadPolicy, agent: str = "echo") -> list[str]:
    """SUBMITS runs submitted concurrently on the thread; their ids (in submit-call order)."""
    ids = [f"{policy}-{i}-{uuid.uuid4().hex[:8]}" for i in range(SUBMITS)]

    def one(run_id: str) -> str:
        try:
            client.submit(agent, f"message {run_id}", thread_id=thread, run_id=run_id, thread_policy=policy)
        except ThreadBusy as busy:
            return f"busy:{busy.run_id}"
        return "ok"

    with ThreadPoolExecutor(SUBMITS) as pool:
        outcomes = list(pool.map(one, ids))
    return [f"{run_id}={outcome}" for run_id, outcome in zip(ids, outcomes, strict=True)]


def _order(client: Client, thread: str) -> list[str]:
    """The thread's runs in thread order."""
    return [str(r) for r in client.store.redis.lrange(client.store.keys.thread(None, thread), 0, -1)]


def _conversation(client: Client, run_id: str) -> list[Message]:
    return [m for m in client.store.load_messages(run_id) if not isinstance(m, SystemMessage)]


def _open(gate: Path) -> None:
    (gate / "open").touch()


def test_enqueue_runs_every_message_in_thread_order_each_on_the_whole_history(
    gated_workers: list[WorkerProcess], client: Client, gate: Path
) -> None:
    thread = f"enq-{uuid.uuid4().hex}"
    blocker = _blocked(client, gate, thread)
    outcomes = _submit_at_once(client, thread, "enqueue")
    assert all(o.endswith("=ok") for o in outcomes)
    order = client.store.thread_waiting(None, thread)
    assert len(order) == SUBMITS
    # Parked without a worker: each waits, IDLE, for the one just before it.
    for previous, run_id in zip([blocker.run_id, *order], order, strict=False):

        def parked(r: str = run_id) -> dict[str, str] | None:
            return client.store.thread_wait(r)

        wait_until(parked, TIMEOUT, what="the run to park")
        assert client.store.thread_wait(run_id) == {"thread_id": thread, "waiting_for": previous}
        assert client.handle(run_id).status().phase is Phase.IDLE
    _open(gate)
    assert blocker.wait(TIMEOUT).phase is Phase.COMPLETED
    heads = [client.handle(r).wait(TIMEOUT) for r in order]
    assert [h.phase for h in heads] == [Phase.COMPLETED] * SUBMITS
    assert _order(client, thread) == [blocker.run_id, *order]
    # Each run continued the conversation of the one before it, which had ended: thread order.
    previous_input = blocker.status().input
    for head in heads:
        conversation = _conversation(client, head.run_id)
        assert [type(m) for m in conversation[-2:]] == [UserMessage, AssistantMessage]
        assert conversation[-2].content == head.input
        earlier_users = [m.content for m in conversation[:-2] if isinstance(m, UserMessage)]
        assert earlier_users[-1] == previous_input
        previous_input = head.input
    # The charge ran once.
    assert _count(gate, f"{blocker.run_id}:1:call_0.effects") == 1
    wait_thread_free(client.store, thread, TIMEOUT)


def test_reject_refuses_every_submit_naming_the_busy_run_and_creates_nothing(
    gated_workers: list[WorkerProcess], client: Client, gate: Path
) -> None:
    thread = f"rej-{uuid.uuid4().hex}"
    blocker = _blocked(client, gate, thread)
    outcomes = _submit_at_once(client, thread, "reject")
    assert [o.split("=", 1)[1] for o in outcomes] == [f"busy:{blocker.run_id}"] * SUBMITS
    for outcome in outcomes:
        assert client.store.load(outcome.split("=", 1)[0]) is None
    assert _order(client, thread) == [blocker.run_id]
    _open(gate)
    assert blocker.wait(TIMEOUT).phase is Phase.COMPLETED
    # Free again: the next submit is taken, and sees the blocker's whole exchange.
    after = client.submit("echo", "and now?", thread_id=thread, thread_policy="reject")
    assert after.wait(TIMEOUT).answer == "seen 1 tool results in 6 messages"


def test_reject_on_a_free_thread_admits_exactly_one_of_twenty_concurrent_submits(
    gated_workers: list[WorkerProcess], client: Client, gate: Path
) -> None:
    thread = f"rej1-{uuid.uuid4().hex}"
    (gate / "open").unlink(missing_ok=True)
    outcomes = _submit_at_once(client, thread, "reject", agent="charge_gated")
    admitted = [o.split("=", 1)[0] for o in outcomes if o.endswith("=ok")]
    assert len(admitted) == 1
    refused = [o.split("=", 1)[1] for o in outcomes if not o.endswith("=ok")]
    assert refused == [f"busy:{admitted[0]}"] * (SUBMITS - 1)
    _open(gate)
    assert client.handle(admitted[0]).wait(TIMEOUT).phase is Phase.COMPLETED


def test_interrupt_stops_the_busy_run_after_its_tool_and_the_last_message_runs_on_its_history(
    gated_workers: list[WorkerProcess], client: Client, gate: Path
) -> None:
    thread = f"int-{uuid.uuid4().hex}"
    blocker = _blocked(client, gate, thread)
    outcomes = _submit_at_once(client, thread, "interrupt")
    assert all(o.endswith("=ok") for o in outcomes)
    # Each run ahead of a later one was asked to stop: one still waiting ends at once, unstarted.
    first, *order = _order(client, thread)
    assert (first, len(order)) == (blocker.run_id, SUBMITS)
    assert client.store.thread_holder(None, thread)[0] == blocker.run_id
    # Asked to stop, the blocker is still inside its non-retry-safe charge: never cut short.
    assert blocker.status().phase is Phase.ACTING
    _open(gate)
    stopped = blocker.wait(TIMEOUT)
    assert stopped.phase is Phase.INTERRUPTED
    assert (
        _count(gate, f"{blocker.run_id}:1:call_0.starts"),
        _count(gate, f"{blocker.run_id}:1:call_0.effects"),
    ) == (1, 1)
    heads = [client.handle(r).wait(TIMEOUT) for r in order]
    # Every run but the last was asked to stop before its turn: it ended without running.
    assert [h.phase for h in heads] == [Phase.INTERRUPTED] * (SUBMITS - 1) + [Phase.COMPLETED]
    assert [h.message_count for h in heads[:-1]] == [0] * (SUBMITS - 1)
    # The last continued the interrupted run's kept history: what it committed, and the charge it
    # stopped before observing, answered by its recorded result (the effect happened: the next run
    # must know it).
    conversation = _conversation(client, order[-1])
    assert [type(m) for m in conversation] == [
        UserMessage,
        AssistantMessage,
        ToolMessage,
        UserMessage,
        AssistantMessage,
    ]
    charge_call = conversation[1]
    assert isinstance(charge_call, AssistantMessage)
    assert [c.name for c in charge_call.tool_calls] == ["charge_gated"]
    result = conversation[2]
    assert isinstance(result, ToolMessage) and not result.is_error
    assert (result.tool_call_id, json.loads(result.content)["label"]) == (charge_call.tool_calls[0].id, "pay")
    assert [conversation[0].content, conversation[3].content] == ["charge me", heads[-1].input]
    assert heads[-1].answer == "seen 1 tool results in 5 messages"


def test_rollback_cancels_the_busy_run_and_drops_its_messages_from_the_thread(
    gated_workers: list[WorkerProcess], client: Client, gate: Path
) -> None:
    thread = f"rb-{uuid.uuid4().hex}"
    before = client.submit("echo", "the kept question", thread_id=thread)
    assert before.wait(TIMEOUT).phase is Phase.COMPLETED
    blocker = _blocked(client, gate, thread)
    outcomes = _submit_at_once(client, thread, "rollback")
    assert all(o.endswith("=ok") for o in outcomes)
    _, first, *order = _order(client, thread)
    assert (first, len(order)) == (blocker.run_id, SUBMITS)
    _open(gate)
    assert blocker.wait(TIMEOUT).phase is Phase.INTERRUPTED
    assert _count(gate, f"{blocker.run_id}:1:call_0.effects") == 1
    heads = [client.handle(r).wait(TIMEOUT) for r in order]
    assert [h.phase for h in heads] == [Phase.INTERRUPTED] * (SUBMITS - 1) + [Phase.COMPLETED]
    assert client.store.rolled_back(None, thread) == {blocker.run_id, *order[:-1]}
    # The last run sees the conversation as it was before the rolled-back runs: none of theirs.
    conversation = _conversation(client, order[-1])
    assert [m.content for m in conversation if isinstance(m, UserMessage)] == [
        "the kept question",
        heads[-1].input,
    ]
    assert heads[-1].answer == "seen 0 tool results in 4 messages"
