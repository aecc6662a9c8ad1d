"""Handoffs on real workers and a real redis-server: triage hands the conversation to billing, whose
tools run and whose answer ends the run; refused handoffs (unknown target, past the limit); a
handoff together with a tool call; the view and the events; the tenant boundary over HTTP; and
forks of a handed-off run, which go on under the agent in charge at their checkpoint, with the
handoff records that led there (``shared/timetravel.py``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from producer.client import Client
from producer.render import render_head
from shared.handoffs import conversation_of
from shared.keys import Keys
from shared.messages import SystemMessage, ToolMessage
from shared.settings import Settings
from shared.state import Phase, RunHead
from shared.tenants import Tenants
from tests.agents_handoffs import BILLING_PROMPT, EFFECTS_KEY, TRIAGE_PROMPT
from tests.api_support import ApiProcess, bearer, wait_status
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
    log_dir = str(tmp_path_factory.mktemp("handoff-workers"))
    with running(
        [WorkerProcess("ho1", server.url, agents=AGENTS, concurrency=2, log_dir=log_dir)]
    ) as started:
        yield started


@pytest.fixture
def client(server: RedisServer, pool: list[WorkerProcess]) -> Iterator[Client]:
    c = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    yield c
    c.close()


def test_a_run_handed_off_goes_on_under_the_target(client: Client) -> None:
    handle = client.submit("triage", "refund A-1")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "billing: refunded A-1"
    assert head.agent == "triage" and head.active_agent == "billing"
    assert head.agent_version == "7" and head.model == "scripted:billing"
    (record,) = head.handoffs
    assert (record.from_agent, record.to_agent, record.to_version, record.step) == (
        "triage",
        "billing",
        "7",
        1,
    )
    assert record.call_id == "call_0" and record.history == "kept"
    # Billing's budget is its own: 3 steps from the handoff on.
    assert (head.step, head.steps_used, head.max_steps) == (3, 3, 4)
    events = list(handle.events(follow=False))
    handed = [e for e in events if e.kind == "HandedOff"]
    assert len(handed) == 1 and handed[0].step == 1
    assert (handed[0].from_agent, handed[0].to_agent, handed[0].call_id) == ("triage", "billing", "call_0")
    kinds = [e.kind for e in events]
    assert kinds.index("HandedOff") < kinds.index("ToolDispatched")  # billing's tool ran after it
    (dispatched,) = [e for e in events if e.kind == "ToolDispatched"]
    assert dispatched.step == 2 and dispatched.tool == "issue_refund"
    assert client.store.redis.hget(EFFECTS_KEY, f"{handle.run_id}:2:call_0") == "1"
    stored = client.store.load_messages(handle.run_id)
    transfers = [m for m in stored if isinstance(m, ToolMessage) and m.name == "transfer_to_billing"]
    assert len(transfers) == 1 and not transfers[0].is_error
    # The stored conversation keeps both system prompts; billing's sees its own, then all that was said.
    assert [m.content for m in stored if isinstance(m, SystemMessage)] == [TRIAGE_PROMPT, BILLING_PROMPT]
    seen = conversation_of(head.handoffs, stored)
    assert isinstance(seen[0], SystemMessage) and seen[0].content == BILLING_PROMPT
    assert sum(isinstance(m, SystemMessage) for m in seen) == 1 and len(seen) == len(stored) - 1
    # The timeline flags the handoff, on the lane of the worker that committed it; the CLI shows it.
    (marker,) = [m for m in handle.timeline().markers if m.kind == "handoff"]
    assert marker.text == "handed off from triage to billing v7 (step 1)" and marker.lane is not None
    shown = render_head(head)
    assert "now      billing v7 (handed off 1 time(s))" in shown
    assert "handoff  step 1: triage -> billing v7" in shown


def test_a_handoff_wins_over_the_calls_beside_it(client: Client) -> None:
    handle = client.submit("triage", "mixed B-2")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "billing: refunded B-2"
    stored = client.store.load_messages(handle.run_id)
    not_run = [m for m in stored if isinstance(m, ToolMessage) and m.name == "issue_refund" and m.is_error]
    assert len(not_run) == 1 and not_run[0].content.startswith("Not run")
    effects = client.store.redis.hgetall(EFFECTS_KEY)
    mine = {str(k): str(v) for k, v in effects.items() if str(k).startswith(handle.run_id + ":")}
    assert mine == {f"{handle.run_id}:2:call_0": "1"}  # billing's call only; triage's never ran


def test_a_handoff_to_an_agent_the_worker_does_not_have_is_refused(client: Client) -> None:
    handle = client.submit("triage", "ghost")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.handoffs == [] and head.active_agent == "triage"
    assert head.answer is not None and head.answer.startswith(
        "triage carries on: Error: not handed off: no agent 'ghost'"
    )
    events = list(handle.events(follow=False))
    assert not [e for e in events if e.kind == "HandedOff"]
    (failed,) = [e for e in events if e.kind == "StepFailed"]
    assert failed.decision == "continue" and failed.error.kind == "InvalidModelAction"
    assert failed.error.tool == "transfer_to_ghost"


def test_handoffs_past_the_limit_are_refused_a_cycle_counting(client: Client) -> None:
    handle = client.submit("triage", "pingpong")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, head.error
    assert [(h.from_agent, h.to_agent, h.step) for h in head.handoffs] == [
        ("triage", "billing", 1),
        ("billing", "triage", 2),
    ]
    assert head.active_agent == "triage" and head.agent_version == "1"
    assert head.answer is not None and "handed off 2 times, the most triage allows" in head.answer
    kinds = [e.kind for e in handle.events(follow=False)]
    assert kinds.count("HandedOff") == 2 and kinds.count("StepFailed") == 1


def test_the_view_shows_the_agent_and_the_handoffs_and_tenants_stay_apart(
    server: RedisServer, pool: list[WorkerProcess]
) -> None:
    api = ApiProcess(server.url, env={"WESICHAIN_AGENTS": AGENTS}).start()
    try:
        tenants = Tenants(server.client(), Keys())
        owner_key, _ = tenants.create_key(f"owner-{uuid.uuid4().hex[:6]}", "test")
        other_key, _ = tenants.create_key(f"other-{uuid.uuid4().hex[:6]}", "test")
        with (
            httpx.Client(base_url=api.url, headers=bearer(owner_key), timeout=30) as owner,
            httpx.Client(base_url=api.url, headers=bearer(other_key), timeout=30) as other,
        ):
            created = owner.post("/v1/runs", json={"agent": "triage", "input": "refund C-3"})
            assert created.status_code in (200, 201, 202), created.text
            run_id = created.json()["run_id"]
            run = wait_status(owner, run_id, {"completed", "failed"}, TIMEOUT)
            assert run["status"] == "completed", run
            assert run["agent"] == "triage" and run["current_agent"] == "billing"
            assert run["handoffs"] == [
                {
                    "from_agent": "triage",
                    "to_agent": "billing",
                    "to_version": "7",
                    "step": 1,
                    "call_id": "call_0",
                }
            ]
            events = owner.get(f"/v1/runs/{run_id}/events").json()
            handed = [e for e in events["events"] if e["kind"] == "HandedOff"]
            assert len(handed) == 1 and handed[0]["to_agent"] == "billing"
            # Another tenant sees neither the run nor its handoffs.
            for path in (f"/v1/runs/{run_id}", f"/v1/runs/{run_id}/events"):
                response = other.get(path)
                assert response.status_code == 404, response.text
                assert response.json()["error"]["kind"] == "not_found", response.text
                assert "billing" not in response.text
    finally:
        api.stop()


# -- forks of a handed-off run ------------------------------------------------------------------------


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
