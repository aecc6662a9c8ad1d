"""Forks of a handed-off run on real workers and a real redis-server: a fork goes on under the agent
in charge at its checkpoint, with the handoff records that led there (``shared/timetravel.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from producer.client import Client
from shared.messages import SystemMessage
from shared.settings import Settings
from shared.state import Phase, RunHead
from tests.agents_handoffs import BILLING_PROMPT, EFFECTS_KEY, TRIAGE_PROMPT
from tests.conftest import _need_redis
from tests.harness import RedisServer, WorkerProcess, running

AGENTS = "tests.agents_handoffs"
TIMEOUT = 60


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    _need_redis()
    s = RedisServer().start()
    yield s
    s.cleanup()


@pytest.fixture(scope="module")
def pool(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    log_dir = str(tmp_path_factory.mktemp("handoff-fork-workers"))
    with running(
        [WorkerProcess("hf1", server.url, agents=AGENTS, concurrency=2, log_dir=log_dir)]
    ) as started:
        yield started


@pytest.fixture
def client(server: RedisServer, pool: list[WorkerProcess]) -> Iterator[Client]:
    c = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    yield c
    c.close()


def _handed_off(client: Client) -> tuple[RunHead, int, int]:
    """A finished run triage handed to billing, its checkpoint just before the handoff (triage
    thinking) and its first one after it (billing thinking)."""
    head = client.submit("triage", "refund A-1").wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED and head.active_agent == "billing", head.error
    thinking = [c for c in client.checkpoints(head.run_id) if c.phase is Phase.THINKING]
    before = next(c.version for c in thinking if c.step == 1)
    after = next(c.version for c in thinking if c.step == 2)
    return head, before, after


def test_a_fork_after_the_handoff_goes_on_under_the_target(client: Client) -> None:
    original, _, after = _handed_off(client)
    handle = client.fork(original.run_id, after)
    fork = handle.wait(TIMEOUT)
    assert fork.phase is Phase.COMPLETED, fork.error
    # Billing answers (its model asserts it is shown its own system prompt first): no new handoff.
    assert fork.answer == "billing: refunded A-1"
    assert fork.agent == "triage" and fork.active_agent == "billing"
    assert fork.handoffs == original.handoffs
    assert (fork.model, fork.agent_version) == ("scripted:billing", "7")
    assert fork.fork is not None and (fork.fork.run_id, fork.fork.version) == (original.run_id, after)
    assert not [e for e in handle.events(follow=False) if e.kind == "HandedOff"]
    # Billing's step is the fork's first: its refund ran once, under the fork's own key.
    assert client.store.redis.hget(EFFECTS_KEY, f"{fork.run_id}:1:call_0") == "1"
    stored = client.store.load_messages(fork.run_id)
    assert [m.content for m in stored if isinstance(m, SystemMessage)] == [TRIAGE_PROMPT, BILLING_PROMPT]


def test_a_fork_before_the_handoff_starts_under_the_original_agent(client: Client) -> None:
    original, before, _ = _handed_off(client)
    handle = client.fork(original.run_id, before)
    fork = handle.wait(TIMEOUT)
    assert fork.phase is Phase.COMPLETED, fork.error
    assert fork.answer == "billing: refunded A-1"
    # Triage thinks first and hands off again: the fork has its own handoff, at its own step 1.
    (record,) = fork.handoffs
    assert (record.from_agent, record.to_agent, record.step) == ("triage", "billing", 1)
    assert [e.kind for e in handle.events(follow=False)].count("HandedOff") == 1


def test_a_fork_whose_edited_input_cuts_the_handoff_off_goes_on_under_the_original_agent(
    client: Client,
) -> None:
    # The edited input replaces the user's message, which came before billing's system prompt:
    # the conversation replayed is triage's, and so is the agent it goes on under.
    original, _, after = _handed_off(client)
    fork = client.fork(original.run_id, after, input="refund B-2").wait(TIMEOUT)
    assert fork.phase is Phase.COMPLETED, fork.error
    assert fork.answer == "billing: refunded B-2"
    (record,) = fork.handoffs
    assert (record.from_agent, record.to_agent, record.step) == ("triage", "billing", 1)
