"""The run store against a real redis-server: creation, claims, fenced commits, fan-in, the sweeper's
inspect and hand-on, cancel, retention and events."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import redis

from shared import events as ev
from shared import fsm, protocol
from shared.errors import InternalInvariant, RunErrorInfo
from shared.llm.base import Usage
from shared.messages import Message, SystemMessage, ToolMessage, UserMessage
from shared.state import Decision, Phase, RunHead, TaskSpec
from shared.store import Busy, CallClaim, Claim, ClaimRef, Done, Due, PhaseClaim, RunStore, Stale
from shared.store.runs import NewRun, Release
from shared.tasks import start_task, task_for
from tests.harness import RedisServer, wait_until
from tests.store_support import make_store, redis_ms

# The run-building helpers live in the testing package (benchmarks use them too).
from worker.testing.runs import (
    CALLS,
    HOLDER,
    call_claim,
    claim,
    commit,
    create,
    record,
    record_all,
    started,
    tool_done,
)


@pytest.fixture
def rds(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def store(rds: redis.Redis) -> RunStore:
    return make_store(rds)


def acting(store: RunStore) -> fsm.Acting:
    thinking = started(store)
    t = thinking.act("calling", CALLS, Usage(input_tokens=1))
    commit(store, thinking, t)
    return t.to


def hash_of(store: RunStore, run_id: str) -> dict[str, str]:
    return store.load_raw(run_id)


def snapshot(store: RunStore, run_id: str) -> dict[str, Any]:
    k, r = store.keys, store.redis
    return {
        "run": r.hgetall(k.run(run_id)),
        "messages": r.lrange(k.messages(run_id), 0, -1),
        "checkpoints": r.lrange(k.checkpoints(run_id), 0, -1),
        "events": r.xrange(k.events(run_id)),
    }


# -- creation ----------------------------------------------------------------------------------------


def test_create_once(store: RunStore) -> None:
    head = create(store, "run-1")
    fields = hash_of(store, "run-1")
    assert (fields["version"], fields["phase"], fields["step"], fields["epoch"]) == ("1", "idle", "0", "0")
    assert fields["outbox_claimed"] == "0"
    assert json.loads(fields["outbox"]) == [start_task("run-1").model_dump()]
    assert store.load("run-1") == head
    assert store.checkpoints("run-1") == [head]
    assert store.redis.zscore(store.keys.runs_index_of("run-1"), "run-1") is not None
    before = snapshot(store, "run-1")
    assert store.create(RunHead.new_idle("run-1", "other-agent", "another question"), []) is False
    assert snapshot(store, "run-1") == before


def test_create_runs_the_start_push_and_the_release_only_when_it_creates(store: RunStore) -> None:
    """The broker commands and the member to release ride the create: both run when the run is
    created, neither when its id is taken (the caller then releases and publishes itself)."""
    store.redis.zadd("held", {"mine": 1, "other": 1})
    push = [("lpush", ("queue", "start-of-run-2"))]
    head = RunHead.new_idle("run-2", "research", "q")
    assert store.create_run(head, [start_task("run-2")], push, Release("held", "mine")) == "pushed"
    assert store.redis.lrange("queue", 0, -1) == ["start-of-run-2"]
    assert store.redis.zrange("held", 0, -1) == ["other"]
    assert store.load("run-2") == head
    again = RunHead.new_idle("run-2", "research", "another")
    assert store.create_run(again, [start_task("run-2")], push, Release("held", "other")) == "exists"
    assert store.redis.lrange("queue", 0, -1) == ["start-of-run-2"]
    assert store.redis.zrange("held", 0, -1) == ["other"]
    # Without broker commands the run is created and the caller publishes.
    assert store.create_run(RunHead.new_idle("run-3", "research", "q"), [start_task("run-3")]) == "created"


def test_a_create_sent_again_after_the_run_moved_on_answers_created(store: RunStore) -> None:
    """A create whose reply was lost is sent again (the client's retry); by then a worker may have
    committed the run's start. The replay still answers 'created' (the caller publishes again, a
    duplicate the start's claim drops), not 'exists', which the API answers 422 for the caller's own
    new run; another create of the same id answers 'exists'."""
    head = RunHead.new_idle(uuid.uuid4().hex, "agent", "question")
    keys, args = store.create_call(NewRun(head, [start_task(head.run_id)]))
    script = store._scripts["create"]
    assert [str(x) for x in script(keys=keys, args=[str(a) for a in args])] == ["created", "0"]
    idle = fsm.Idle(head)
    initial: list[Message] = [SystemMessage(content="s"), UserMessage(content="question")]
    t = idle.start(initial, agent_version="1", model="scripted:x", max_steps=5)
    commit(store, idle, t)
    assert store.load(head.run_id) == t.head  # moved on: its op id is the commit's now
    assert [str(x) for x in script(keys=keys, args=[str(a) for a in args])] == ["created", "0"]
    assert store.load(head.run_id) == t.head
    other = RunHead.new_idle(head.run_id, "agent", "question")
    assert store.create_run(other, [start_task(head.run_id)]) == "exists"


def test_create_refuses_anything_but_a_new_idle_head(store: RunStore) -> None:
    with pytest.raises(InternalInvariant):
        store.create(RunHead.new_idle("r", "a", "q").model_copy(update={"version": 2}), [])


def test_every_key_of_a_run_is_in_its_shard_slot(store: RunStore) -> None:
    """Each script touches the run's keys and its shard's indexes: one hash tag, one cluster slot."""
    k = store.keys
    for run_id in ("a", "b", uuid.uuid4().hex):
        tag = f"{{s{k.shard(run_id)}}}"
        keys = [
            k.run(run_id),
            k.messages(run_id),
            k.checkpoints(run_id),
            k.events(run_id),
            k.results(run_id, 3),
            k.attempts(run_id),
            k.leases_of(run_id),
            k.runs_index_of(run_id),
            k.ended_of(run_id),
            k.archiver_lock(k.shard(run_id)),
        ]
        assert all(key.count("{") == 1 and tag in key for key in keys), keys


# -- commits: compare-and-set, as the claim's holder -------------------------------------------------


def test_commit_over_a_wrong_version_is_fenced_and_changes_nothing(store: RunStore) -> None:
    thinking = started(store)
    run_id = thinking.head.run_id
    held = claim(store, thinking.head)
    before = snapshot(store, run_id)
    t = thinking.complete("answer", Usage())
    for wrong in (1, 3, 99):
        forged = t.head.model_copy(update={"version": wrong + 1})
        at = thinking.head.model_copy(update={"version": wrong})
        assert store.commit(at, forged, held.ref, t.messages, t.events).status == "fenced"
    assert snapshot(store, run_id) == before
    assert store.commit(thinking.head, t.head, held.ref, t.messages, t.events).status == "committed"
    loaded = store.load(run_id)
    assert loaded is not None and loaded.phase is Phase.COMPLETED and loaded.version == 3


def test_only_the_claim_holder_commits(store: RunStore) -> None:
    thinking = started(store)
    held = claim(store, thinking.head)
    t = thinking.complete("answer", Usage())
    before = snapshot(store, thinking.head.run_id)
    for ref in (ClaimRef(protocol.RUNNING, "not-the-token"), None):
        assert store.commit(thinking.head, t.head, ref, t.messages, t.events).status == "fenced"
    assert snapshot(store, thinking.head.run_id) == before
    assert store.commit(thinking.head, t.head, held.ref, t.messages, t.events).status == "committed"


def test_a_replayed_commit_is_recognised(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit the client sends again after losing the reply answers 'committed', not 'fenced'."""
    thinking = started(store)
    held = claim(store, thinking.head)
    t = thinking.complete("answer", Usage())
    script = store._scripts["commit"]
    sent: list[list[str]] = []

    def twice(*, keys: list[str], args: list[str]) -> Any:
        sent.append(args)
        script(keys=keys, args=args)
        return script(keys=keys, args=args)

    monkeypatch.setitem(store._scripts, "commit", twice)
    assert store.commit(thinking.head, t.head, held.ref, t.messages, t.events).status == "committed"
    assert len(store.load_messages(t.head.run_id)) == 3, "the replay appended again"
    assert store.redis.llen(store.keys.checkpoints(t.head.run_id)) == 3


def test_commit_on_a_missing_run_is_fenced(store: RunStore) -> None:
    head = RunHead.new_idle("ghost", "agent", "q").model_copy(update={"version": 5})
    assert store.commit(head.model_copy(update={"version": 4}), head, None).status == "fenced"
    assert store.load("ghost") is None
    assert store.redis.exists(store.keys.run("ghost")) == 0


def test_commit_refuses_a_version_that_does_not_follow(store: RunStore) -> None:
    thinking = started(store)
    with pytest.raises(InternalInvariant, match="commit of version 5 over 2"):
        store.commit(thinking.head, thinking.head.model_copy(update={"version": 5}), None)


def test_an_unclaimed_commit_waits_for_a_live_claim_to_go(rds: redis.Redis) -> None:
    store = make_store(rds, lease_s=0.2)
    thinking = started(store)
    claim(store, thinking.head)
    t = thinking.fail(RunErrorInfo(kind="PoisonPhase", message="x"))
    assert store.commit(thinking.head, t.head, None, (), t.events).status == "fenced"
    wait_until(
        lambda: store.commit(thinking.head, t.head, None, (), t.events).status == "committed",
        5,
        what="the claim to expire",
    )


def test_checkpoints_hold_one_head_per_version_fan_in_included(store: RunStore) -> None:
    act = acting(store)
    h = act.head
    record_all(store, act)
    checkpoints = store.checkpoints(h.run_id)
    assert [c.version for c in checkpoints] == [1, 2, 3, 4]
    assert [c.phase for c in checkpoints] == [Phase.IDLE, Phase.THINKING, Phase.ACTING, Phase.OBSERVING]
    assert same_head(checkpoints[-1], act.observe().head)


def test_checkpoint_size_does_not_grow_with_the_input(store: RunStore) -> None:
    """The run's input and metadata are stored once, not copied into every checkpoint."""

    def checkpoint_bytes(input_chars: int) -> int:
        head = RunHead.new_idle(uuid.uuid4().hex, "agent", "q" * input_chars, metadata={"m": "z" * 4000})
        assert store.create(head, [start_task(head.run_id)])
        idle = fsm.Idle(head)
        t = idle.start(
            [SystemMessage(content="sys"), UserMessage(content="q")],
            agent_version="1",
            model="m:x",
            max_steps=9,
        )
        commit(store, idle, t)
        current = t.to
        for _ in range(4):
            error = RunErrorInfo(kind="InvalidModelAction", message="bad")
            nxt = current.reprompt(error, "r", "c", Usage(), consume_budget=False)
            commit(store, current, nxt)
            current = nxt.to
        raw = store.redis.lrange(store.keys.checkpoints(head.run_id), 0, -1)
        assert len(raw) == 6
        return sum(len(str(c).encode()) for c in raw)

    small, large = checkpoint_bytes(10), checkpoint_bytes(1_000_000)
    assert large - small < 100, f"six checkpoints cost {large - small} more bytes with a 1 MB input"
    assert small < 6 * 1000, f"six checkpoints of a small run cost {small} bytes"


# -- messages: appended, and a commit's cost independent of history ---------------------------------


def test_messages_are_appended(store: RunStore) -> None:
    act = acting(store)
    run_id = act.head.run_id
    assert store.redis.llen(store.keys.messages(run_id)) == 3
    record_all(store, act)
    observing = fsm.view_as(must_load(store, run_id), fsm.Observing)
    results = store.load_results(run_id, 1)
    t = observing.next_step(results)
    commit(store, observing, t)
    messages = store.load_messages(run_id)
    assert len(messages) == 5 == t.head.message_count
    assert messages[3:] == [
        ToolMessage(tool_call_id="a", name="add", content="3"),
        ToolMessage(tool_call_id="b", name="add", content="7"),
    ]
    assert store.load_messages(run_id, 3, 3) == [messages[3]]


def test_a_commit_appends_every_message_in_order_past_one_push_of_them(store: RunStore) -> None:
    """The script pushes a commit's messages 100 at a time: 250 land whole and in order."""
    idle = fsm.Idle(create(store))
    sent: list[Message] = [SystemMessage(content="sys"), *(UserMessage(content=f"m{i}") for i in range(249))]
    t = idle.start(sent, agent_version="1", model="scripted:x", max_steps=100)
    commit(store, idle, t)
    assert store.load_messages(idle.head.run_id) == sent
    assert t.head.message_count == 250


def test_commit_cost_does_not_grow_with_history(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    script = store._scripts["commit"]

    def recording(*, keys: list[str], args: list[str]) -> Any:
        sizes.append(sum(len(a.encode()) for a in args))
        return script(keys=keys, args=args)

    current = started(store)
    monkeypatch.setitem(store._scripts, "commit", recording)
    for i in range(60):
        # A reprompt appends exactly two messages and keeps the run THINKING.
        error = RunErrorInfo(kind="InvalidModelAction", message="bad")
        t = current.reprompt(error, "x" * 500, f"correction {i}", Usage(), consume_budget=False)
        commit(store, current, t)
        current = t.to
    history = store.redis.lrange(store.keys.messages(current.head.run_id), 0, -1)
    assert sum(len(str(m).encode()) for m in history) > 30_000
    # The only growth is in counters (version, message_count, digits of "correction N").
    assert max(sizes) - min(sizes) < 40, sizes


# -- claiming a phase --------------------------------------------------------------------------------


def test_claim_of_a_missing_run(store: RunStore) -> None:
    assert store.claim_phase(PhaseClaim("nope", 1, Phase.IDLE, 0, 0), HOLDER) is None


def test_claim_counts_attempts_and_sets_the_lease_by_redis_time(store: RunStore) -> None:
    head = create(store)
    run_id = head.run_id
    before = redis_ms(store)
    first = claim(store, head)
    assert (first.attempts, first.prior, first.cancel_requested, first.messages, first.last_error) == (
        1,
        "none",
        False,
        [],
        "",
    )
    assert first.head == head and first.field == protocol.RUNNING
    value = protocol.ClaimValue.parse(hash_of(store, run_id)[protocol.RUNNING])
    assert (value.token, value.holder) == (first.token, HOLDER)
    lease_ms = store.settings.lease_s * 1000
    assert before + lease_ms <= value.deadline_ms <= redis_ms(store) + lease_ms
    assert store.redis.zscore(store.keys.leases_of(run_id), run_id) == value.deadline_ms
    assert hash_of(store, run_id)[protocol.OUTBOX_CLAIMED] == "1"
    # A second delivery while the claim is live does nothing, whatever it claims to be.
    assert isinstance(store.claim_phase(PhaseClaim(run_id, 1, Phase.IDLE, 0, 0), HOLDER), Busy)
    # A released claim leaves no trace of an unknown outcome, and is no attempt of the work: a
    # delivery that found nothing to do (a decide before any decision) did not try it.
    assert store.release(run_id, first.field, first.token, 1)
    assert not store.release(run_id, first.field, first.token, 1)
    for _ in range(10):  # as many early decides as messages sent into a parked run
        again = claim(store, head)
        assert (again.attempts, again.prior) == (1, "none")
        assert store.release(run_id, again.field, again.token, 1)
    assert store.attempts(run_id) == {protocol.attempts_field(1, protocol.RUNNING): "0"}


def test_release_only_by_the_holder(store: RunStore) -> None:
    head = create(store)
    held = claim(store, head)
    assert not store.release(head.run_id, held.field, "another-token", head.version)
    assert protocol.RUNNING in hash_of(store, head.run_id)


def test_a_claim_is_taken_over_only_once_expired(rds: redis.Redis) -> None:
    store = make_store(rds, lease_s=0.2)
    head = create(store)
    first = claim(store, head)
    assert isinstance(store.claim_phase(PhaseClaim(head.run_id, 1, Phase.IDLE, 0, 0), HOLDER), Busy)
    deadline = protocol.ClaimValue.parse(hash_of(store, head.run_id)[protocol.RUNNING]).deadline_ms
    wait_until(lambda: redis_ms(store) > deadline, 5, what="the claim to expire")
    again = claim(store, head)
    assert (again.attempts, again.prior) == (2, "expired")
    assert again.token != first.token


def test_a_dead_holder_s_claim_expires_at_once(store: RunStore) -> None:
    head = create(store)
    held = claim(store, head)
    field = held.field
    assert not store.expire_dead_holder(head.run_id, 1, field, "other-host:1", "died")
    assert isinstance(store.claim_phase(PhaseClaim(head.run_id, 1, Phase.IDLE, 0, 0), HOLDER), Busy)
    assert store.expire_dead_holder(head.run_id, 1, field, HOLDER, "its process died (signal 9)")
    again = claim(store, head)
    assert (again.attempts, again.prior, again.last_error) == (2, "expired", "its process died (signal 9)")


def test_claim_reads_the_messages(store: RunStore) -> None:
    thinking = started(store)
    held = claim(store, thinking.head, read_messages=True)
    assert held.messages == [SystemMessage(content="sys"), UserMessage(content="question")]
    assert held.head == thinking.head


@pytest.mark.parametrize(
    ("version", "phase", "epoch", "step"),
    [
        (1, Phase.THINKING, 0, 1),
        (3, Phase.THINKING, 0, 1),
        (2, Phase.ACTING, 0, 1),
        (2, Phase.THINKING, 1, 1),
        (2, Phase.THINKING, 0, 2),
    ],
)
def test_claim_stale(store: RunStore, version: int, phase: Phase, epoch: int, step: int) -> None:
    thinking = started(store)
    h = thinking.head
    attempts = store.attempts(h.run_id)
    stale = store.claim_phase(PhaseClaim(h.run_id, version, phase, epoch, step), HOLDER)
    assert isinstance(stale, Stale)
    assert (stale.version, stale.phase, stale.epoch, stale.outbox_claimed) == (2, Phase.THINKING, 0, False)
    assert stale.outbox == task_for(h)
    # A stale delivery claims nothing and counts no attempt.
    assert protocol.RUNNING not in hash_of(store, h.run_id)
    assert store.attempts(h.run_id) == attempts
    claim(store, h)
    stale = store.claim_phase(PhaseClaim(h.run_id, version, phase, epoch, step), HOLDER)
    assert isinstance(stale, Stale) and stale.outbox_claimed is True


# -- claiming a tool call ----------------------------------------------------------------------------


def test_tool_claims_name_the_step_and_the_call(store: RunStore) -> None:
    h = acting(store).head
    a, b = call_claim(store, h, "a"), call_claim(store, h, "b")
    assert isinstance(a, Claim) and isinstance(b, Claim)
    assert (a.field, b.field) == ("call:1:a", "call:1:b")
    assert (a.attempts, b.attempts) == (1, 1)
    assert isinstance(call_claim(store, h, "a"), Busy)


@pytest.mark.parametrize("step", [0, 2, 7])
def test_a_tool_message_for_another_step_is_stale(store: RunStore, step: int) -> None:
    h = acting(store).head
    attempts = store.attempts(h.run_id)
    assert isinstance(call_claim(store, h, "a", step=step), Stale)
    assert isinstance(call_claim(store, h, "not-a-call"), Stale)
    assert store.attempts(h.run_id) == attempts


def test_a_call_with_its_result_is_done(store: RunStore) -> None:
    act = acting(store)
    held = call_claim(store, act.head, "a")
    record(store, act, held, CALLS[0], "3")
    assert isinstance(call_claim(store, act.head, "a"), Done)


# -- results and the fan-in ---------------------------------------------------------------------------


def same_head(a: RunHead, b: RunHead) -> bool:
    """Equal but for the time each was made."""
    return a.model_dump(exclude={"updated_at"}) == b.model_dump(exclude={"updated_at"})


def must_load(store: RunStore, run_id: str) -> RunHead:
    head = store.load(run_id)
    assert head is not None
    return head


def test_record_result_once_and_fan_in(store: RunStore) -> None:
    act = acting(store)
    h = act.head
    events_before = len(store.read_events(h.run_id))
    a = call_claim(store, h, "a")
    assert record(store, act, a, CALLS[0], "3") == "recorded"
    assert record(store, act, a, CALLS[0], "3") == "recorded", "a replay answers as the first time"
    assert record(store, act, a, CALLS[0], "a different outcome") == "duplicate"
    assert hash_of(store, h.run_id)[protocol.PHASE] == "acting"
    assert "call:1:a" not in hash_of(store, h.run_id)
    b = call_claim(store, h, "b")
    assert record(store, act, b, CALLS[1], "7") == "complete"
    loaded = must_load(store, h.run_id)
    assert same_head(loaded, act.observe().head)
    fields = hash_of(store, h.run_id)
    assert json.loads(fields[protocol.OUTBOX]) == [task_for(loaded)[0].model_dump()]
    assert fields[protocol.OUTBOX_CLAIMED] == "0"
    assert not [f for f in fields if f.startswith(protocol.CALL_CLAIM_PREFIX)]
    new_events = [e for _, e in store.read_events(h.run_id)][events_before:]
    assert [e.kind for e in new_events] == ["ToolCompleted", "ToolCompleted"]
    assert record(store, act, b, CALLS[1], "7") == "stale", "the run moved on: a later delivery is stale"
    assert store.redis.llen(store.keys.checkpoints(h.run_id)) == 4


def test_a_replayed_fan_in_answers_as_the_first_time(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    act = acting(store)
    record(store, act, call_claim(store, act.head, "a"), CALLS[0], "3")
    b = call_claim(store, act.head, "b")
    script = store._scripts["record_result"]
    replies: list[Any] = []

    def twice(*, keys: list[str], args: list[str]) -> Any:
        replies.append(script(keys=keys, args=args))
        replies.append(script(keys=keys, args=args))
        return replies[-1]

    monkeypatch.setitem(store._scripts, "record_result", twice)
    assert record(store, act, b, CALLS[1], "7") == "complete"
    assert replies[0] == replies[1]
    assert store.redis.llen(store.keys.checkpoints(act.head.run_id)) == 4


def test_the_fan_in_reports_the_current_epoch(store: RunStore) -> None:
    act = acting(store)
    h = act.head
    a, b = call_claim(store, h, "a"), call_claim(store, h, "b")
    store.redis.hset(store.keys.run(h.run_id), protocol.EPOCH, "4")
    record(store, act, a, CALLS[0], "1")
    observing = act.observe().head
    result, event = tool_done(h, CALLS[1], "2")
    recorded = store.record_result(h, b.ref, result, event, observing, task_for(observing)[0])
    assert (recorded.status, recorded.epoch) == ("complete", 4)
    loaded = must_load(store, h.run_id)
    assert loaded.epoch == 4 and loaded.version == 4


def test_a_stale_result_is_not_recorded(store: RunStore) -> None:
    act = acting(store)
    h = act.head
    held = call_claim(store, h, "a")
    wrong = fsm.Acting(h.model_copy(update={"version": 2}))
    assert record(store, wrong, held, CALLS[0], "3") == "stale"
    assert store.load_results(h.run_id, 1) == []


# -- cancel ------------------------------------------------------------------------------------------


def test_a_cancel_wins_over_every_commit_but_the_interruption(store: RunStore) -> None:
    thinking = started(store)
    h = thinking.head
    held = claim(store, h)
    assert store.request_cancel(h.run_id) is Phase.THINKING
    assert store.cancel_requested(h.run_id)
    before = snapshot(store, h.run_id)
    act = thinking.act(None, CALLS, Usage())
    done = thinking.complete("an answer", Usage())
    failed = thinking.fail(RunErrorInfo(kind="ModelTransport", message="x"))
    for t in (act, done, failed):
        assert store.commit(h, t.head, held.ref, t.messages, t.events).status == "cancel_pending"
    assert snapshot(store, h.run_id) == before
    end = thinking.interrupt("cancelled")
    assert store.commit(h, end.head, held.ref, end.messages, end.events).status == "committed"
    assert must_load(store, h.run_id).phase is Phase.INTERRUPTED
    assert store.request_cancel(h.run_id) is Phase.INTERRUPTED


def test_cancel_of_a_terminal_or_missing_run(store: RunStore) -> None:
    thinking = started(store)
    t = thinking.complete("done", Usage())
    commit(store, thinking, t)
    assert store.request_cancel(t.head.run_id) is Phase.COMPLETED
    assert protocol.CANCEL not in hash_of(store, t.head.run_id)
    assert store.request_cancel("missing") is None
    assert store.redis.exists(store.keys.run("missing")) == 0


# -- renewing ----------------------------------------------------------------------------------------


def test_renew_extends_live_claims_in_one_round_trip(store: RunStore) -> None:
    h = acting(store).head
    a, b = call_claim(store, h, "a"), call_claim(store, h, "b")
    field = lambda c: protocol.ClaimValue.parse(hash_of(store, h.run_id)[c.field])  # noqa: E731
    deadline_a, deadline_b = field(a).deadline_ms, field(b).deadline_ms
    wait_until(
        lambda: redis_ms(store) > deadline_a - store.settings.lease_s * 1000 + 20, 5, what="time to pass"
    )
    store.request_cancel(h.run_id)
    replies = store.renew(
        [
            (h.run_id, a.field, a.token, True),
            (h.run_id, b.field, b.token, False),
            (h.run_id, a.field, "x", True),
        ]
    )
    assert replies == [(True, True), (True, True), (False, True)]
    assert field(a).deadline_ms > deadline_a
    assert field(b).deadline_ms == deadline_b, "a claim past its renewal deadline is only checked"


# -- the sweeper's inspect and hand-on ----------------------------------------------------------------


def expire_queued(store: RunStore, run_id: str) -> None:
    store.redis.hset(store.keys.run(run_id), protocol.QUEUED_UNTIL, 0)


def test_inspect_a_live_run(rds: redis.Redis) -> None:
    store = make_store(rds, queued_lease_s=60)
    thinking = started(store)
    run_id = thinking.head.run_id
    assert store.inspect(run_id) == "alive"  # queued, within its queued time
    claim(store, thinking.head)
    assert store.inspect(run_id) == "alive"  # claimed and live
    assert store.inspect("missing") == "settled"


def test_inspect_and_hand_on_an_expired_claim(rds: redis.Redis) -> None:
    store = make_store(rds, lease_s=0.2)
    thinking = started(store)
    run_id = thinking.head.run_id
    held = claim(store, thinking.head)
    deadline = protocol.ClaimValue.parse(hash_of(store, run_id)[protocol.RUNNING]).deadline_ms
    wait_until(lambda: redis_ms(store) > deadline, 5, what="the claim to expire")
    due = store.inspect(run_id)
    assert isinstance(due, Due) and due.states == {"": "expired"} and due.expired == [""]
    handed = store.hand_on(due, [], "its lease expired")
    assert handed is not None and (handed.epoch, handed.lost, handed.tasks) == (1, 0, [""])
    assert protocol.RUNNING not in hash_of(store, run_id)
    assert store.attempts(run_id)[f"err:{protocol.attempts_field(2, protocol.RUNNING)}"] == (
        f"its lease expired (held by {HOLDER})"
    )
    # The old delivery can no longer commit; the old epoch's messages are stale.
    t = thinking.complete("late", Usage())
    assert store.commit(thinking.head, t.head, held.ref, t.messages, t.events).status == "fenced"
    assert isinstance(store.claim_phase(PhaseClaim(run_id, 2, Phase.THINKING, 0, 1), HOLDER), Stale)
    assert isinstance(store.claim_phase(PhaseClaim(run_id, 2, Phase.THINKING, 1, 1), HOLDER), Claim)


def test_a_claim_reads_the_last_error_of_the_attempt_before_it(rds: redis.Redis) -> None:
    """The first claim of a piece of work has no last error; the claim after a lost holder reads
    why that holder lost it, for a phase and for a tool call alike."""
    store = make_store(rds, lease_s=0.2)
    thinking = started(store)
    run_id = thinking.head.run_id
    first = claim(store, thinking.head)
    assert (first.attempts, first.last_error, first.prior) == (1, "", "none")
    assert store.expire_dead_holder(run_id, 2, protocol.RUNNING, HOLDER, "its worker saw it die")
    second = claim(store, thinking.head)
    assert (second.attempts, second.last_error, second.prior) == (2, "its worker saw it die", "expired")

    act = thinking.act("calling", CALLS, Usage(input_tokens=1))
    assert store.commit(thinking.head, act.head, second.ref, act.messages, act.events).status == "committed"
    a = call_claim(store, act.head, "a")
    assert (a.attempts, a.last_error) == (1, "")
    field = protocol.call_claim(act.head.step, "a")
    assert store.expire_dead_holder(run_id, act.head.version, field, HOLDER, "the tool's process died")
    again = call_claim(store, act.head, "a")
    assert (again.attempts, again.last_error, again.prior) == (2, "the tool's process died", "expired")


def test_inspect_a_queued_phase_past_its_time_and_wait(store: RunStore) -> None:
    thinking = started(store)
    run_id = thinking.head.run_id
    expire_queued(store, run_id)
    due = store.inspect(run_id)
    assert isinstance(due, Due) and due.unclaimed == [""] and due.queued_checks == 0
    assert due.task_of("") == task_for(thinking.head)[0]
    assert store.wait_in_queue(due, 30.0)
    assert store.inspect(run_id) == "alive"
    score = store.redis.zscore(store.keys.leases_of(run_id), run_id)
    assert score is not None and score >= redis_ms(store) + 29_000
    assert hash_of(store, run_id)[protocol.QUEUED_CHECKS] == "1"
    assert hash_of(store, run_id)[protocol.EPOCH] == "0"


def test_hand_on_lost_messages_counts_them(store: RunStore) -> None:
    thinking = started(store)
    run_id = thinking.head.run_id
    for n in (1, 2):
        expire_queued(store, run_id)
        due = store.inspect(run_id)
        assert isinstance(due, Due)
        handed = store.hand_on(due, [""], "its message was missing from the broker")
        assert handed is not None and (handed.epoch, handed.lost, handed.tasks) == (n, n, [""])


def test_a_hand_on_of_a_run_that_moved_does_nothing(store: RunStore) -> None:
    thinking = started(store)
    run_id = thinking.head.run_id
    expire_queued(store, run_id)
    due = store.inspect(run_id)
    assert isinstance(due, Due)
    claim(store, thinking.head)  # a delivery arrived meanwhile: the task is no longer unclaimed
    assert store.hand_on(due, [""], "missing") is None
    assert hash_of(store, run_id)[protocol.EPOCH] == "0"


def test_racing_hand_ons_bump_the_epoch_once(store: RunStore) -> None:
    thinking = started(store)
    run_id = thinking.head.run_id
    expire_queued(store, run_id)
    due = store.inspect(run_id)
    assert isinstance(due, Due)
    results: list[object] = []
    barrier = threading.Barrier(6)

    def hand_on() -> None:
        barrier.wait()
        results.append(store.hand_on(due, [""], "missing"))

    threads = [threading.Thread(target=hand_on) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r is not None for r in results) == 1
    assert must_load(store, run_id).epoch == 1


def test_hand_on_of_a_fan_out_republishes_what_is_not_done_or_live(rds: redis.Redis) -> None:
    store = make_store(rds, lease_s=0.2)
    act = acting(store)
    h = act.head
    a = call_claim(store, h, "a")
    record(store, act, a, CALLS[0], "3")
    b = call_claim(store, h, "b")
    deadline = protocol.ClaimValue.parse(hash_of(store, h.run_id)[b.field]).deadline_ms
    wait_until(lambda: redis_ms(store) > deadline, 5, what="b's claim to expire")
    due = store.inspect(h.run_id)
    assert isinstance(due, Due) and due.states == {"a": "done", "b": "expired"}
    handed = store.hand_on(due, [], "its lease expired")
    assert handed is not None and handed.tasks == ["b"]
    # The expired claim stays as a marker: the next delivery of b knows its outcome is unknown.
    again = store.claim_call(CallClaim(h.run_id, h.version, 1, 1, "b"), HOLDER)
    assert isinstance(again, Claim) and again.prior == "expired"


# -- leases, retention and threads -------------------------------------------------------------------


def test_leases_follow_the_phase(rds: redis.Redis) -> None:
    store = make_store(rds, queued_lease_s=60)
    thinking = started(store)
    run_id = thinking.head.run_id
    score = store.redis.zscore(store.keys.leases_of(run_id), run_id)
    assert score is not None and abs(score - (redis_ms(store) + 60_000)) < 5_000
    t = thinking.complete("done", Usage())
    commit(store, thinking, t)
    assert store.redis.zscore(store.keys.leases_of(run_id), run_id) is None


def test_every_key_of_a_finished_run_expires(store: RunStore) -> None:
    act = acting(store)
    h = act.head
    record_all(store, act)
    observing = fsm.view_as(must_load(store, h.run_id), fsm.Observing)
    end = observing.interrupt("cancelled")
    commit(store, observing, end)
    keys = sorted(store.redis.scan_iter(match=f"{store.keys.run(h.run_id)}*"))
    assert store.keys.attempts(h.run_id) in keys and store.keys.results(h.run_id, 1) in keys
    assert {key: 3590 <= store.redis.ttl(key) <= 3600 for key in keys} == dict.fromkeys(keys, True)


def test_join_thread_once(store: RunStore) -> None:
    barrier = threading.Barrier(5)
    ids: list[list[str]] = []

    def join() -> None:
        barrier.wait()
        ids.append(store.join_thread(None, "t1", "run-b"))

    store.join_thread(None, "t1", "run-a")
    threads = [threading.Thread(target=join) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(i == ["run-a", "run-b"] for i in ids)
    assert 0 < store.redis.ttl(store.keys.thread(None, "t1")) <= 3600


# -- events ------------------------------------------------------------------------------------------


def test_event_stream_holds_exactly_the_committed_events_in_order(store: RunStore) -> None:
    idle = fsm.Idle(create(store))
    run_id = idle.head.run_id
    assert store.read_events(run_id) == []
    t1 = idle.start([UserMessage(content="q")], agent_version="1", model="m:x", max_steps=5)
    commit(store, idle, t1)
    t2 = t1.to.act("go", CALLS, Usage())
    held = claim(store, t1.head)
    assert (
        store.commit(
            idle.head, t2.head.model_copy(update={"version": 2}), held.ref, t2.messages, t2.events
        ).status
        == "fenced"
    )
    assert store.commit(t1.head, t2.head, held.ref, t2.messages, t2.events).status == "committed"
    entries = store.read_events(run_id)
    assert dumps(e for _, e in entries) == dumps([*t1.events, *t2.events])
    ids = [i for i, _ in entries]
    # Each event read carries its stream id, to resume after it.
    assert [e.stream_id for _, e in entries] == ids
    assert dumps(e for _, e in store.read_events(run_id, after=ids[2])) == dumps(t2.events[1:])
    assert store.read_events(run_id, after=ids[-1]) == []
    assert dumps(e for _, e in store.wait_events(run_id, after=ids[1], timeout_s=0.1)) == dumps(t2.events)
    assert store.wait_events(run_id, after=ids[-1], timeout_s=0.05) == []


def dumps(events: Iterable[ev.Event]) -> list[dict[str, Any]]:
    return [e.model_dump() for e in events]


def test_emit_appends_outside_commits(store: RunStore) -> None:
    thinking = started(store)
    run_id = thinking.head.run_id
    step = thinking.head.step
    deltas = [ev.TokenDelta(run_id=run_id, step=step, text=t) for t in ("a", "b")]
    assert store.emit(run_id, deltas, step=step) == 2
    assert store.emit(run_id, []) == 0
    assert dumps(e for _, e in store.read_events(run_id))[-2:] == dumps(deltas)
    # The text of a model call for another step (one that lost the run) is not appended.
    stale = ev.TokenDelta(run_id=run_id, step=step + 1, text="stale")
    assert store.emit(run_id, [stale], step=step + 1) == 0


def test_nothing_is_emitted_after_a_runs_end_event(store: RunStore) -> None:
    # A stream ends at the run's end event: a delta or notice after it was never sent to a follower.
    thinking = started(store)
    run_id = thinking.head.run_id
    commit(store, thinking, thinking.complete("answer", Usage()))
    late = [ev.TokenDelta(run_id=run_id, step=thinking.head.step, text="late")]
    assert store.emit(run_id, late, step=thinking.head.step) == 0
    assert store.emit(run_id, late) == 0
    assert store.read_events(run_id)[-1][1].kind == "Completed"
    assert store.emit("no-such-run", late) == 0


# -- human decisions on parked runs ------------------------------------------------------------------


def parked(store: RunStore) -> fsm.Parked:
    thinking = started(store)
    t = thinking.park("may I?", CALLS, Usage(), needs_approval=["add"])
    commit(store, thinking, t)
    return t.to


def test_parked_runs_hold_no_lease(store: RunStore) -> None:
    p = parked(store)
    assert store.redis.zscore(store.keys.leases_of(p.head.run_id), p.head.run_id) is None
    assert store.redis.ttl(store.keys.run(p.head.run_id)) == -1


def test_submit_decision_once_per_parked_version(store: RunStore) -> None:
    p = parked(store)
    h = p.head
    yes = Decision(approve=True, note="ok")
    assert store.submit_decision(h.run_id, h.version - 1, yes) is False
    assert store.submit_decision(h.run_id, h.version, yes) is True
    assert store.submit_decision(h.run_id, h.version, Decision(approve=False)) is False
    assert store.load_decision(h.run_id) == yes
    # The commit that acts on the decision consumes it.
    commit(store, p, p.approve())
    assert store.load_decision(h.run_id) is None


def test_submit_decision_on_a_run_that_is_not_parked(store: RunStore) -> None:
    thinking = started(store)
    h = thinking.head
    assert store.submit_decision(h.run_id, h.version, Decision(approve=True)) is False
    assert store.submit_decision("missing", 1, Decision(approve=True)) is False


def test_an_outbox_holds_tasks_without_loss(store: RunStore) -> None:
    act = acting(store)
    stored = json.loads(hash_of(store, act.head.run_id)[protocol.OUTBOX])
    assert [TaskSpec.model_validate(t) for t in stored] == task_for(act.head)


def test_time_comes_from_redis_not_the_client(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client whose clock is far off sets the same deadlines as any other."""
    monkeypatch.setattr(time, "time", lambda: 10.0)  # 1970
    head = create(store)
    claim(store, head)
    deadline = protocol.ClaimValue.parse(hash_of(store, head.run_id)[protocol.RUNNING]).deadline_ms
    monkeypatch.undo()
    assert abs(deadline - (redis_ms(store) + store.settings.lease_s * 1000)) < 5_000


# -- commit and publish in one script ----------------------------------------------------------------

PUSH = [("lpush", ("q:test", '{"m": 1}')), ("lpush", ("q:test", '{"m": 2}')), ("publish", ("ev", "x"))]


def _thinking_commit(store: RunStore, push: Any, epoch: int | None = None) -> tuple[Any, str]:
    thinking = started(store)
    held = claim(store, thinking.head)
    if epoch is not None:
        store.redis.hset(store.keys.run(thinking.head.run_id), protocol.EPOCH, str(epoch))
    t = thinking.act("calling", CALLS, Usage(input_tokens=1))
    result = store.commit(thinking.head, t.head, held.ref, t.messages, t.events, task_for(t.head), push)
    return result, thinking.head.run_id


def test_a_commit_runs_its_publish_commands_in_the_same_script(store: RunStore) -> None:
    store.redis.delete("q:test")
    result, _ = _thinking_commit(store, PUSH)
    assert (result.status, result.pushed) == ("committed", True)
    assert store.redis.lrange("q:test", 0, -1) == ['{"m": 2}', '{"m": 1}']  # LPUSH order, as kombu's
    store.redis.delete("q:test")


def test_a_commit_leaves_the_publish_to_the_caller_when_the_epoch_moved(store: RunStore) -> None:
    # The commands were built for epoch 0; the sweeper handed the run on since (epoch 1).
    store.redis.delete("q:test")
    result, run_id = _thinking_commit(store, PUSH, epoch=1)
    assert (result.status, result.epoch, result.pushed) == ("committed", 1, False)
    assert store.redis.llen("q:test") == 0
    assert store.load(run_id) is not None


def test_a_fenced_commit_publishes_nothing(store: RunStore) -> None:
    store.redis.delete("q:test")
    thinking = started(store)
    held = claim(store, thinking.head)
    t = thinking.act("calling", CALLS, Usage(input_tokens=1))
    stolen = ClaimRef(held.field, "not-the-token")
    result = store.commit(thinking.head, t.head, stolen, t.messages, t.events, task_for(t.head), PUSH)
    assert (result.status, result.pushed) == ("fenced", False)
    assert store.redis.llen("q:test") == 0


def test_a_publish_command_outside_the_allowed_ones_is_refused(store: RunStore) -> None:
    with pytest.raises(InternalInvariant, match="'del'"):
        _thinking_commit(store, [("del", ("q:test",))])


def test_the_fan_in_publishes_observe_in_its_script(store: RunStore) -> None:
    store.redis.delete("q:test")
    act = acting(store)
    record(store, act, call_claim(store, act.head, "a"), CALLS[0], "3")
    held = call_claim(store, act.head, "b")
    observing = act.observe().head
    result, event = tool_done(act.head, CALLS[1], "7")
    push = [("lpush", ("q:test", "observe"))]
    recorded = store.record_result(act.head, held.ref, result, event, observing, task_for(observing)[0], push)
    assert (recorded.status, recorded.pushed) == ("complete", True)
    assert store.redis.lrange("q:test", 0, -1) == ["observe"]
    store.redis.delete("q:test")
