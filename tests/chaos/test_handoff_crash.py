"""SIGKILL a whole worker in the middle of a handoff: after the model asked for it, before its
commit (the handoff's input filter hangs there). The think is handed on to the other worker, which
asks the model again and commits the handoff: the run completes under the target with exactly one
``HandedOff`` event, one answer to the transfer call, and the target's non-retry-safe tool run once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from producer.client import Client
from shared.handoffs import conversation_of
from shared.messages import SystemMessage, ToolMessage
from shared.state import Phase
from tests.agents_handoffs import BILLING_PROMPT, EFFECTS_KEY, FILTER_CALLS_KEY, FILTER_PIDS_KEY
from tests.broker import Settings
from tests.chaos.support import RUN_TIMEOUT_S, Cluster, note_recovery
from tests.harness import RedisServer, wait_until

AGENTS = "tests.agents_handoffs"


@pytest.fixture
def handoff_client(server: RedisServer) -> Iterator[Client]:
    c = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    yield c
    c.close()


def test_a_worker_killed_between_the_models_answer_and_the_handoff_commit(
    cluster: Cluster, handoff_client: Client
) -> None:
    workers = cluster.start(2, agents=AGENTS, env={"WESICHAIN_HOOKS": ""})
    client = handoff_client
    r = client.store.redis
    text = "slow D-4"
    handle = client.submit("triage", text)
    pid = int(
        wait_until(lambda: r.hget(FILTER_PIDS_KEY, text), RUN_TIMEOUT_S, what="the handoff's input filter")
    )
    (victim,) = [w for w in workers if pid in w.pids()]
    # Nothing of the handoff is committed while its filter runs.
    assert handle.status().phase is Phase.THINKING and handle.status().handoffs == []
    killed_at = time.time()
    victim.kill()

    head = handle.wait(RUN_TIMEOUT_S)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "billing: refunded D-4"
    assert head.active_agent == "billing" and head.epoch >= 1  # handed on by the sweeper
    (record,) = head.handoffs
    assert (record.from_agent, record.to_agent, record.step, record.history) == (
        "triage",
        "billing",
        1,
        "filtered",
    )
    assert r.hget(FILTER_CALLS_KEY, text) == "2"  # killed once, then run again by the other worker

    events = list(handle.events(follow=False))
    handed = [e for e in events if e.kind == "HandedOff"]
    assert len(handed) == 1 and handed[0].worker.pid != pid
    assert [e.kind for e in events].count("RunStarted") == 1
    stored = client.store.load_messages(handle.run_id)
    transfers = [m for m in stored if isinstance(m, ToolMessage) and m.name == "transfer_to_billing_filtered"]
    assert len(transfers) == 1
    # The filter dropped the tool calls: billing's conversation is its prompt, the question, and its own step.
    seen = conversation_of(head.handoffs, stored)
    assert isinstance(seen[0], SystemMessage) and seen[0].content == BILLING_PROMPT
    assert not any(isinstance(m, ToolMessage) and m.name.startswith("transfer_to_") for m in seen)
    assert r.hget(EFFECTS_KEY, f"{handle.run_id}:2:call_0") == "1"
    note_recovery("whole worker killed inside a handoff's input filter", handed[0].ts - killed_at)
