"""A message sent while the run's last think asks the model, on a real worker and a real
redis-server: the commit of the answer is refused while a signal past the think's cursor waits
(``commit.lua``), so the think applies the message and asks again; the message is never
``discarded``, and the run's answer is the one given with it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from producer.client import Client
from shared.messages import UserMessage
from shared.settings import Settings
from shared.state import Phase
from tests.agents_reliability import ANSWER_HOLDING_KEY, ANSWER_RELEASE_KEY
from tests.conftest import _need_redis
from tests.harness import RedisServer, WorkerProcess, running, wait_until

AGENTS = "tests.agents_reliability"
TIMEOUT = 60


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    _need_redis()
    s = RedisServer().start()
    yield s
    s.cleanup()


@pytest.fixture(scope="module")
def pool(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    log_dir = str(tmp_path_factory.mktemp("signal-answer-workers"))
    with running([WorkerProcess("sa1", server.url, agents=AGENTS, log_dir=log_dir)]) as started:
        yield started


@pytest.fixture
def client(server: RedisServer, pool: list[WorkerProcess]) -> Iterator[Client]:
    c = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    yield c
    c.close()


def test_a_message_sent_while_the_last_think_answers_is_applied_not_discarded(client: Client) -> None:
    token = uuid.uuid4().hex
    handle = client.submit("answer_held", token)
    r = client.store.redis
    # The think is asking the model (which holds): its answer has no tool calls, so it ends the run.
    wait_until(lambda: r.exists(ANSWER_HOLDING_KEY + token), TIMEOUT, what="the think to ask the model")
    sent = handle.send_message("one more thing")
    assert sent.status == "pending"
    r.set(ANSWER_RELEASE_KEY + token, "1", ex=3600)
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == f"heard: {token} | one more thing"
    assert handle.signal(sent.id).status == "accepted"
    assert head.signals_applied == sent.id == 1
    users = [m.content for m in client.store.load_messages(handle.run_id) if isinstance(m, UserMessage)]
    assert users == [token, "one more thing"]
    events = [e for e in handle.events(follow=False) if e.kind != "TokenDelta"]
    # The refused answer left nothing: one answer, given after the message was applied.
    assert [e.kind for e in events].count("ModelResponded") == 1
    kinds = [e.kind for e in events]
    assert kinds.index("SignalApplied") < kinds.index("ModelResponded") < kinds.index("Completed")


def test_an_answer_with_no_signal_waiting_ends_the_run_at_once(client: Client) -> None:
    token = uuid.uuid4().hex
    client.store.redis.set(ANSWER_RELEASE_KEY + token, "1", ex=3600)
    head = client.submit("answer_held", token).wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED and head.answer == f"heard: {token}"
    assert head.signals_applied == 0 and head.step == 1
