"""A thread's next run after a handoff, on real workers and a real redis-server: it continues the
conversation the last agent saw, so with a filtered history the user's words come once, not twice
(the stored list also keeps the part before the handoff)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from producer.client import Client
from shared.messages import SystemMessage, UserMessage
from shared.settings import Settings
from shared.state import Phase
from tests.conftest import _need_redis
from tests.harness import RedisServer, WorkerProcess, running

AGENTS = "shared.examples.research"
TIMEOUT = 60


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """A server of its own: the suite's shared workers (another agents module) consume nothing here."""
    _need_redis()
    s = RedisServer().start()
    yield s
    s.cleanup()


@pytest.fixture(scope="module")
def research_client(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    log_dir = str(tmp_path_factory.mktemp("thread-handoff-workers"))
    with running([WorkerProcess("th1", server.url, agents=AGENTS, concurrency=2, log_dir=log_dir)]):
        client = Client(Settings(redis_url=server.url, agents_module=AGENTS))
        yield client
        client.close()


def test_the_next_run_of_a_thread_sees_each_user_message_of_a_handed_off_run_once(
    research_client: Client,
) -> None:
    thread = f"desk-{uuid.uuid4().hex}"
    first = research_client.submit("research-desk", "What is a lease?", thread_id=thread)
    head = first.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED and head.active_agent == "research"
    stored = research_client.store.load_messages(first.run_id)
    # Stored append-only: the desk's part and the filtered copy the research assistant took over.
    assert [m.content for m in stored if isinstance(m, UserMessage)] == ["What is a lease?"] * 2

    second = research_client.submit("research-desk", "What is Flower?", thread_id=thread)
    assert second.wait(TIMEOUT).phase is Phase.COMPLETED
    stored = research_client.store.load_messages(second.run_id)
    # What run 2 started from, before its desk handed off: run 1's conversation as research saw it.
    start = stored[: next(i for i, m in enumerate(stored[1:], 1) if isinstance(m, SystemMessage))]
    assert [m.content for m in start if isinstance(m, UserMessage)] == ["What is a lease?", "What is Flower?"]
