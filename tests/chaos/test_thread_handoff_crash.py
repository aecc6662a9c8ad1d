"""A thread's runs on the research example's front desk (a filtered handoff to ``research``), each
start phase (where a run takes the thread's history) inside a worker SIGKILLed whole: the run is
taken over, the thread handed on, and the second run still continues the first's conversation as
its last agent saw it, each user message once."""

from __future__ import annotations

import uuid

from producer.client import Client
from shared.messages import SystemMessage, UserMessage
from shared.state import Phase
from tests.broker import Settings
from tests.chaos.support import RUN_TIMEOUT_S, Cluster, wait_paused, wait_terminal
from tests.harness import RedisServer, wait_thread_free

AGENTS = "shared.examples.research"


def test_start_phases_killed_on_a_thread_after_a_handoff(cluster: Cluster, server: RedisServer) -> None:
    client = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    try:
        thread = f"desk-{uuid.uuid4().hex}"
        cluster.start(2, env={"WESICHAIN_FAULT": "pause:idle"}, agents=AGENTS)
        first = client.submit("research-desk", "What is a lease?", thread_id=thread, check_agent=False)
        victim = cluster.owner(wait_paused(client.store.redis, Phase.IDLE, first.run_id))
        victim.kill()
        head = wait_terminal(first)
        assert head.phase is Phase.COMPLETED and head.active_agent == "research", head.error

        second = client.submit("research-desk", "What is Flower?", thread_id=thread, check_agent=False)
        victim = cluster.owner(wait_paused(client.store.redis, Phase.IDLE, second.run_id))
        victim.kill()
        cluster.revive()  # no live worker was left: one comes back and takes the start over
        head = wait_terminal(second)
        assert head.phase is Phase.COMPLETED and head.active_agent == "research", head.error

        stored = client.store.load_messages(second.run_id)
        start = stored[: next(i for i, m in enumerate(stored[1:], 1) if isinstance(m, SystemMessage))]
        assert [m.content for m in start if isinstance(m, UserMessage)] == [
            "What is a lease?",
            "What is Flower?",
        ]
        wait_thread_free(client.store, thread, RUN_TIMEOUT_S)  # the thread is handed on, free
    finally:
        client.close()
