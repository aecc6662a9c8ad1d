"""The run store against a real redis-server: CAS commits, claims, fan-in, cancel, retention, events."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from shared import events as ev
from shared import fsm
from shared.errors import InternalInvariant, RunErrorInfo
from shared.llm.base import Usage
from shared.messages import SystemMessage, ToolCall, ToolMessage, UserMessage, dump_message
from shared.settings import Settings
from shared.state import Decision, Phase, RunHead, TaskSpec, ToolResult
from shared.store import Busy, Claim, RunStore, Stale
from tests.harness import RedisServer, wait_until

CALLS = [
    ToolCall(id="a", name="add", arguments={"a": 1, "b": 2}),
    ToolCall(id="b", name="add", arguments={"a": 3, "b": 4}),
]


@pytest.fixture
def rds(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def store(rds: redis.Redis) -> RunStore:
    return RunStore(rds, Settings(prefix=f"t-{uuid.uuid4().hex[:10]}:", retention_s=3600))


def spec(head: RunHead, what: str) -> TaskSpec:
    return TaskSpec(
        name=f"wesichain.{what}",
        task_id=f"{head.run_id}:v{head.version}:{what}",
        arguments={"run_id": head.run_id, "version": head.version},
    )


def create(store: RunStore, run_id: str | None = None) -> RunHead:
    head = RunHead.new_idle(run_id or uuid.uuid4().hex, "agent", "question")
    assert store.commit(None, head, outbox=[spec(head, "start")]) == "committed"
    return head


def started(store: RunStore) -> fsm.Thinking:
    """A run committed through start: THINKING at version 2 with two messages."""
    idle = fsm.Idle(create(store))
    t = idle.start(
        [SystemMessage(content="sys"), UserMessage(content="question")],
        agent_version="1",
        model="scripted:x",
        max_steps=100,
    )
    assert store.commit(1, t.head, t.messages, t.events, [spec(t.head, "think")]) == "committed"
    return t.to


def acting(store: RunStore) -> fsm.Acting:
    thinking = started(store)
    t = thinking.act("calling", CALLS, Usage(input_tokens=1))
    assert store.commit(thinking.head.version, t.head, t.messages, t.events) == "committed"
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


# -- create and compare-and-set -------------------------------------------------------------------


def test_create_then_duplicate_create_is_fenced(store: RunStore) -> None:
    head = create(store, "run-1")
    fields = hash_of(store, "run-1")
    assert (fields["version"], fields["phase"], fields["step"], fields["epoch"]) == ("1", "idle", "0", "0")
    assert fields["outbox_sent"] == "0"
    assert json.loads(fields["outbox"]) == [spec(head, "start").model_dump()]
    assert store.load("run-1") == head
    assert store.checkpoints("run-1") == [head]
    assert store.redis.zscore(store.keys.runs_index(), "run-1") is not None

    before = snapshot(store, "run-1")
    other = RunHead.new_idle("run-1", "other-agent", "another question")
    assert store.commit(
        None, other, [UserMessage(content="x")], [ev.StepStarted(run_id="run-1", step=1)]
    ) == ("fenced")
    assert snapshot(store, "run-1") == before
    loaded = store.load("run-1")
    assert loaded is not None and loaded.agent == "agent"


def test_commit_over_a_wrong_version_is_fenced_and_changes_nothing(store: RunStore) -> None:
    thinking = started(store)
    run_id = thinking.head.run_id
    before = snapshot(store, run_id)
    t = thinking.complete("answer", Usage())
    for wrong in (1, 3, 99):
        forged = t.head.model_copy(update={"version": wrong + 1})
        assert store.commit(wrong, forged, t.messages, t.events) == "fenced"
    assert snapshot(store, run_id) == before
    # The right version still commits afterwards.
    assert store.commit(thinking.head.version, t.head, t.messages, t.events) == "committed"
    loaded = store.load(run_id)
    assert loaded is not None and loaded.phase is Phase.COMPLETED and loaded.version == 3


def test_commit_on_a_missing_run_is_fenced(store: RunStore) -> None:
    head = RunHead.new_idle("ghost", "agent", "q").model_copy(update={"version": 5})
    assert store.commit(4, head) == "fenced"
    assert store.load("ghost") is None
    assert store.redis.exists(store.keys.run("ghost")) == 0


def test_commit_refuses_a_version_that_does_not_follow(store: RunStore) -> None:
    thinking = started(store)
    with pytest.raises(InternalInvariant, match="commit of version 5 over 2"):
        store.commit(2, thinking.head.model_copy(update={"version": 5}))


def test_checkpoints_hold_every_committed_head_in_order(store: RunStore) -> None:
    thinking = started(store)
    t = thinking.complete("done", Usage())
    store.commit(thinking.head.version, t.head, t.messages, t.events)
    checkpoints = store.checkpoints(t.head.run_id)
    assert [c.version for c in checkpoints] == [1, 2, 3]
    assert [c.phase for c in checkpoints] == [Phase.IDLE, Phase.THINKING, Phase.COMPLETED]
    assert checkpoints[-1] == t.head


# -- messages: appended, and a commit's cost independent of history -------------------------------


def test_messages_are_appended(store: RunStore) -> None:
    thinking = started(store)
    run_id = thinking.head.run_id
    assert store.load_messages(run_id) == [SystemMessage(content="sys"), UserMessage(content="question")]
    t = thinking.act("calling", CALLS, Usage())
    store.commit(thinking.head.version, t.head, t.messages, t.events)
    assert store.redis.llen(store.keys.messages(run_id)) == 3
    t2 = t.to.observe()
    store.commit(t.head.version, t2.head, t2.messages, t2.events)
    assert store.redis.llen(store.keys.messages(run_id)) == 3
    results = [ToolResult(call_id=c.id, name=c.name, ok=True, output=str(i)) for i, c in enumerate(CALLS)]
    t3 = t2.to.next_step(results)
    store.commit(t2.head.version, t3.head, t3.messages, t3.events)
    messages = store.load_messages(run_id)
    assert len(messages) == 5 == t3.head.message_count
    assert messages[2:] == [
        *t.messages,
        ToolMessage(tool_call_id="a", name="add", content="0"),
        ToolMessage(tool_call_id="b", name="add", content="1"),
    ]
    assert store.load_messages(run_id, 3, 3) == [messages[3]]


class Recorder:
    """Wraps the commit script to see exactly what each commit sends to Redis."""

    def __init__(self, script: Any) -> None:
        self.script = script
        self.calls: list[list[str]] = []

    def __call__(self, *, keys: list[str], args: list[str]) -> Any:
        self.calls.append(list(args))
        return self.script(keys=keys, args=args)


def test_commit_cost_does_not_grow_with_history(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder(store._commit)
    monkeypatch.setattr(store, "_commit", recorder)
    current: fsm.Thinking = started(store)
    run_id = current.head.run_id
    filler = "x" * 500
    sizes: list[int] = []
    for i in range(60):
        # A reprompt appends exactly two messages and keeps the run THINKING.
        error = RunErrorInfo(kind="InvalidModelAction", message="bad")
        t = current.reprompt(error, filler, f"correction {i}", Usage(), consume_budget=False)
        recorder.calls.clear()
        assert store.commit(current.head.version, t.head, t.messages, t.events) == "committed"
        (args,) = recorder.calls
        n_messages, n_events = int(args[13]), int(args[14])
        assert (n_messages, n_events) == (2, 1)
        assert len(args) == 15 + n_messages + n_events
        # Only the new messages travel, never the history.
        assert args[15 : 15 + n_messages] == [dump_message(m) for m in t.messages]
        sizes.append(sum(len(a.encode()) for a in args))
        assert store.redis.llen(store.keys.messages(run_id)) == 2 + 2 * (i + 1)
        current = t.to
    history = store.redis.lrange(store.keys.messages(run_id), 0, -1)
    history_bytes = sum(len(str(m).encode()) for m in history)
    assert history_bytes > 30_000
    # The only growth is in counters (version, message_count, digits of "correction N").
    assert max(sizes) - min(sizes) < 40, sizes


# -- begin: claims, attempts, stale deliveries ------------------------------------------------------


def test_begin_missing_run(store: RunStore) -> None:
    assert store.begin("nope", 1, Phase.IDLE, 0, 0, "0:start") is None


def test_begin_claims_and_counts_attempts(store: RunStore) -> None:
    head = create(store)
    run_id = head.run_id
    first = store.begin(run_id, 1, Phase.IDLE, 0, 0, "0:start")
    assert isinstance(first, Claim)
    assert (first.attempts, first.prior, first.cancel_requested, first.messages) == (1, "none", False, [])
    assert first.head == head
    assert first.claim_field == "running"
    fields = hash_of(store, run_id)
    assert fields["outbox_sent"] == "1"
    assert fields["running"].startswith(first.token + "|")
    assert store.redis.zscore(store.keys.leases(), run_id) == pytest.approx(
        time.time() + store.settings.lease_s, abs=2
    )

    # A second delivery while the claim is live does nothing.
    assert isinstance(store.begin(run_id, 1, Phase.IDLE, 0, 0, "0:start"), Busy)

    # A redelivery after worker loss takes the live claim over.
    second = store.begin(run_id, 1, Phase.IDLE, 0, 0, "0:start", takeover=True)
    assert isinstance(second, Claim)
    assert (second.attempts, second.prior) == (2, "takeover")
    assert second.token != first.token

    # Released claims leave no trace of an unknown outcome.
    store.release_claim(run_id, second.claim_field, second.token)
    third = store.begin(run_id, 1, Phase.IDLE, 0, 0, "0:start")
    assert isinstance(third, Claim)
    assert (third.attempts, third.prior) == (3, "none")
    # Attempts are counted per attempt field.
    assert store.redis.hgetall(store.keys.attempts(run_id)) == {"0:start": "3"}


def test_begin_after_an_expired_claim(rds: redis.Redis) -> None:
    store = RunStore(rds, Settings(prefix=f"t-{uuid.uuid4().hex[:10]}:", lease_s=0.05))
    head = create(store)
    first = store.begin(head.run_id, 1, Phase.IDLE, 0, 0, "0:start")
    assert isinstance(first, Claim)
    deadline = float(hash_of(store, head.run_id)["running"].split("|")[1])
    wait_until(lambda: time.time() > deadline + 0.01, timeout=5, what="the claim to expire")
    again = store.begin(head.run_id, 1, Phase.IDLE, 0, 0, "0:start")
    assert isinstance(again, Claim)
    assert (again.attempts, again.prior) == (2, "expired")


def test_tool_claims_are_per_call(store: RunStore) -> None:
    act = acting(store)
    h = act.head
    a = store.begin(h.run_id, h.version, Phase.ACTING, h.epoch, h.step, f"{h.step}:tool:a", call_id="a")
    b = store.begin(h.run_id, h.version, Phase.ACTING, h.epoch, h.step, f"{h.step}:tool:b", call_id="b")
    assert isinstance(a, Claim) and isinstance(b, Claim)
    assert (a.claim_field, b.claim_field) == ("claim:a", "claim:b")
    assert (a.attempts, b.attempts) == (1, 1)
    busy = store.begin(h.run_id, h.version, Phase.ACTING, h.epoch, h.step, f"{h.step}:tool:a", call_id="a")
    assert isinstance(busy, Busy)


def test_begin_with_messages(store: RunStore) -> None:
    thinking = started(store)
    h = thinking.head
    claim = store.begin(h.run_id, h.version, Phase.THINKING, 0, 1, "1:think", with_messages=True)
    assert isinstance(claim, Claim)
    assert claim.messages == [SystemMessage(content="sys"), UserMessage(content="question")]
    assert claim.head == h


@pytest.mark.parametrize(
    ("version", "phase", "epoch"),
    [(1, Phase.THINKING, 0), (3, Phase.THINKING, 0), (2, Phase.ACTING, 0), (2, Phase.THINKING, 1)],
)
def test_begin_stale(store: RunStore, version: int, phase: Phase, epoch: int) -> None:
    thinking = started(store)
    h = thinking.head
    stale = store.begin(h.run_id, version, phase, epoch, 1, "x")
    assert isinstance(stale, Stale)
    assert stale.head == h
    assert stale.outbox == [spec(h, "think")]
    assert stale.outbox_sent is False
    # A stale delivery claims nothing and counts no attempt.
    assert "running" not in hash_of(store, h.run_id)
    assert store.redis.exists(store.keys.attempts(h.run_id)) == 0
    # Once the right delivery claimed the phase, the outbox is known to be sent.
    assert isinstance(store.begin(h.run_id, 2, Phase.THINKING, 0, 1, "1:think"), Claim)
    stale = store.begin(h.run_id, version, phase, epoch, 1, "x")
    assert isinstance(stale, Stale) and stale.outbox_sent is True


# -- record_result: exactly once, and the atomic fan-in ---------------------------------------------


def tool_done(head: RunHead, call: ToolCall, output: str) -> tuple[ToolResult, ev.ToolCompleted]:
    result = ToolResult(call_id=call.id, name=call.name, ok=True, output=output)
    event = ev.ToolCompleted(
        run_id=head.run_id, step=head.step, call_id=call.id, tool=call.name, ok=True, output=output
    )
    return result, event


def test_record_result_fan_in(store: RunStore) -> None:
    act = acting(store)
    h = act.head
    observe = spec(h.model_copy(update={"version": h.version + 1}), "observe")
    events_before = len(store.read_events(h.run_id))

    ra, ea = tool_done(h, CALLS[0], "3")
    assert store.record_result(h, ra, ea, observe) == ("recorded", 0)
    assert store.record_result(h, ra, ea, observe)[0] == "duplicate"
    other, other_event = tool_done(h, CALLS[0], "a different outcome")
    assert store.record_result(h, other, other_event, observe)[0] == "duplicate"
    assert hash_of(store, h.run_id)["phase"] == "acting"
    assert store.load_results(h.run_id, h.step) == [ra]
    assert store.has_result(h.run_id, h.step, "a") and not store.has_result(h.run_id, h.step, "b")

    rb, eb = tool_done(h, CALLS[1], "7")
    assert store.record_result(h, rb, eb, observe) == ("complete", 0)
    fields = hash_of(store, h.run_id)
    assert (fields["phase"], fields["version"]) == ("observing", str(h.version + 1))
    assert json.loads(fields["outbox"]) == [observe.model_dump()]
    assert fields["outbox_sent"] == "0"
    loaded = store.load(h.run_id)
    assert loaded is not None
    assert (loaded.phase, loaded.version, loaded.pending_calls) == (Phase.OBSERVING, h.version + 1, CALLS)
    assert sorted(store.load_results(h.run_id, h.step), key=lambda r: r.call_id) == [ra, rb]
    # One ToolCompleted per recorded result, none for the duplicates.
    new_events = [e for _, e in store.read_events(h.run_id)][events_before:]
    assert new_events == [ea, eb]

    # The run moved on: a late result of this version is stale.
    assert store.record_result(h, rb, eb, observe)[0] == "stale"


def test_record_result_stale_version(store: RunStore) -> None:
    act = acting(store)
    h = act.head
    wrong = h.model_copy(update={"version": h.version - 1})
    r, e = tool_done(wrong, CALLS[0], "3")
    assert store.record_result(wrong, r, e, spec(h, "observe"))[0] == "stale"
    assert store.load_results(h.run_id, h.step) == []
    assert hash_of(store, h.run_id)["phase"] == "acting"


def test_record_result_reports_the_current_epoch(store: RunStore) -> None:
    act = acting(store)
    h = act.head
    store.redis.hset(store.keys.run(h.run_id), "epoch", "4")
    r, e = tool_done(h, CALLS[0], "1")
    assert store.record_result(h, r, e, spec(h, "observe"))[0] == "recorded"
    r, e = tool_done(h, CALLS[1], "2")
    assert store.record_result(h, r, e, spec(h, "observe")) == ("complete", 4)


# -- cancel -----------------------------------------------------------------------------------------


def test_cancel_blocks_non_terminal_commits_but_not_the_end(store: RunStore) -> None:
    thinking = started(store)
    h = thinking.head
    assert store.request_cancel(h.run_id) is Phase.THINKING
    assert hash_of(store, h.run_id)["cancel"] == "1"
    assert store.cancel_requested(h.run_id)
    before = snapshot(store, h.run_id)
    t = thinking.act(None, CALLS, Usage())
    assert store.commit(h.version, t.head, t.messages, t.events) == "cancel_pending"
    assert snapshot(store, h.run_id) == before
    claim = store.begin(h.run_id, h.version, Phase.THINKING, 0, 1, "1:think")
    assert isinstance(claim, Claim) and claim.cancel_requested

    end = thinking.interrupt("cancelled")
    assert store.commit(h.version, end.head, end.messages, end.events) == "committed"
    loaded = store.load(h.run_id)
    assert loaded is not None and loaded.phase is Phase.INTERRUPTED
    # Cancelling a finished run changes nothing.
    assert store.request_cancel(h.run_id) is Phase.INTERRUPTED


def test_cancel_of_a_terminal_or_missing_run(store: RunStore) -> None:
    thinking = started(store)
    t = thinking.complete("done", Usage())
    store.commit(thinking.head.version, t.head, t.messages, t.events)
    assert store.request_cancel(t.head.run_id) is Phase.COMPLETED
    assert "cancel" not in hash_of(store, t.head.run_id)
    assert store.request_cancel("missing") is None
    assert store.redis.exists(store.keys.run("missing")) == 0


# -- leases and retention ---------------------------------------------------------------------------


def test_leases_follow_the_phase(store: RunStore) -> None:
    thinking = started(store)
    run_id = thinking.head.run_id
    score = store.redis.zscore(store.keys.leases(), run_id)
    assert score == pytest.approx(time.time() + store.settings.queued_lease_s, abs=2)
    t = thinking.complete("done", Usage())
    store.commit(thinking.head.version, t.head, t.messages, t.events)
    assert store.redis.zscore(store.keys.leases(), run_id) is None


def test_terminal_commit_sets_retention_ttls(store: RunStore) -> None:
    thinking = started(store)
    k, run_id = store.keys, thinking.head.run_id
    run_keys = [k.run(run_id), k.messages(run_id), k.checkpoints(run_id), k.events(run_id)]
    assert [store.redis.ttl(key) for key in run_keys] == [-1, -1, -1, -1]
    t = thinking.fail(RunErrorInfo(kind="BudgetExceeded", message="out of steps"))
    assert store.commit(thinking.head.version, t.head, t.messages, t.events) == "committed"
    for key in run_keys:
        assert 3590 <= store.redis.ttl(key) <= 3600, key


def test_every_key_of_a_finished_run_expires(store: RunStore) -> None:
    act = acting(store)
    h = act.head
    for call in CALLS:
        claim = store.begin(
            h.run_id, h.version, Phase.ACTING, 0, h.step, f"{h.step}:tool:{call.id}", call_id=call.id
        )
        assert isinstance(claim, Claim)
        r, e = tool_done(h, call, "ok")
        store.record_result(h, r, e, spec(h, "observe"))
    observing = fsm.Observing(store.load(h.run_id))  # type: ignore[arg-type]
    end = observing.interrupt("cancelled")
    assert store.commit(observing.head.version, end.head, end.messages, end.events) == "committed"
    keys = sorted(store.redis.scan_iter(match=f"{store.keys.prefix}run:{{{h.run_id}}}*"))
    assert store.keys.attempts(h.run_id) in keys and store.keys.results(h.run_id, h.step) in keys
    assert {key: store.redis.ttl(key) > 0 for key in keys} == dict.fromkeys(keys, True)


# -- events -----------------------------------------------------------------------------------------


def test_event_stream_holds_exactly_the_committed_events_in_order(store: RunStore) -> None:
    idle = fsm.Idle(create(store))
    run_id = idle.head.run_id
    assert store.read_events(run_id) == []
    t1 = idle.start([UserMessage(content="q")], agent_version="1", model="m:x", max_steps=5)
    store.commit(1, t1.head, t1.messages, t1.events)
    t2 = t1.to.act("go", CALLS, Usage())
    # A fenced commit adds no events.
    assert store.commit(1, t2.head.model_copy(update={"version": 2}), t2.messages, t2.events) == "fenced"
    store.commit(t1.head.version, t2.head, t2.messages, t2.events)
    entries = store.read_events(run_id)
    assert [e for _, e in entries] == [*t1.events, *t2.events]
    assert [e.kind for _, e in entries] == [
        "RunStarted",
        "StepStarted",
        "ModelResponded",
        "ToolDispatched",
        "ToolDispatched",
    ]
    ids = [i for i, _ in entries]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    # Reading after a cursor returns only what follows it.
    assert [e for _, e in store.read_events(run_id, after=ids[2])] == list(t2.events[1:])
    assert store.read_events(run_id, after=ids[-1]) == []
    assert [e for _, e in store.wait_events(run_id, after=ids[1], timeout_s=0.1)] == list(t2.events)
    assert store.wait_events(run_id, after=ids[-1], timeout_s=0.05) == []


def test_emit_appends_outside_commits(store: RunStore) -> None:
    thinking = started(store)
    run_id = thinking.head.run_id
    deltas = [ev.TokenDelta(run_id=run_id, step=1, text=t) for t in ("a", "b")]
    store.emit(run_id, deltas)
    store.emit(run_id, [])
    assert [e for _, e in store.read_events(run_id)][-2:] == deltas


def test_messages_round_trip(store: RunStore) -> None:
    thinking = started(store)
    correction = 'ünïcode ✓ \n\t "quotes"'
    t = thinking.reprompt(
        RunErrorInfo(kind="InvalidModelAction", message="x"), "raw ✓", correction, Usage(), False
    )
    store.commit(thinking.head.version, t.head, t.messages, t.events)
    assert store.load_messages(thinking.head.run_id)[-2:] == list(t.messages)


# -- human decisions on parked runs -----------------------------------------------------------------


def parked(store: RunStore) -> fsm.AwaitingApproval:
    thinking = started(store)
    t = thinking.park("may I?", CALLS, Usage(), needs_approval=["add"])
    assert store.commit(thinking.head.version, t.head, t.messages, t.events) == "committed"
    return t.to


def test_parked_runs_hold_no_lease(store: RunStore) -> None:
    p = parked(store)
    assert store.redis.zscore(store.keys.leases(), p.head.run_id) is None
    assert [store.redis.ttl(k) for k in (store.keys.run(p.head.run_id),)] == [-1]


def test_submit_decision_once_per_parked_version(store: RunStore) -> None:
    p = parked(store)
    h = p.head
    assert store.load_decision(h.run_id) is None
    yes = Decision(approve=True, note="ok")
    assert store.submit_decision(h.run_id, h.version - 1, yes) is False
    assert store.load_decision(h.run_id) is None
    assert store.submit_decision(h.run_id, h.version, yes) is True
    assert store.submit_decision(h.run_id, h.version, Decision(approve=False)) is False
    assert store.load_decision(h.run_id) == yes
    # The commit that acts on the decision consumes it.
    t = p.approve()
    assert store.commit(h.version, t.head, t.messages, t.events) == "committed"
    assert store.load_decision(h.run_id) is None
    assert store.submit_decision(h.run_id, t.head.version, yes) is False


def test_submit_decision_on_a_run_that_is_not_parked(store: RunStore) -> None:
    thinking = started(store)
    h = thinking.head
    assert store.submit_decision(h.run_id, h.version, Decision(approve=True)) is False
    assert store.submit_decision("missing", 1, Decision(approve=True)) is False
    assert store.load_decision(h.run_id) is None


def test_checkpoint_size_does_not_grow_with_the_input(store: RunStore) -> None:
    """The run's input and metadata are stored once, not copied into every checkpoint."""

    def checkpoint_bytes(input_chars: int) -> int:
        head = RunHead.new_idle(uuid.uuid4().hex, "agent", "q" * input_chars, metadata={"m": "z" * 4000})
        assert store.commit(None, head, outbox=[spec(head, "start")]) == "committed"
        current: fsm.Thinking = (
            fsm.Idle(head)
            .start(
                [SystemMessage(content="sys"), UserMessage(content="q")],
                agent_version="1",
                model="m:x",
                max_steps=99,
            )
            .to
        )
        assert store.commit(1, current.head) == "committed"
        for _ in range(4):
            error = RunErrorInfo(kind="InvalidModelAction", message="bad")
            t = current.reprompt(error, "r", "c", Usage(), consume_budget=False)
            assert store.commit(current.head.version, t.head, t.messages, t.events) == "committed"
            current = t.to
        raw = store.redis.lrange(store.keys.checkpoints(head.run_id), 0, -1)
        assert len(raw) == 6
        return sum(len(c.encode()) for c in raw)

    small, large = checkpoint_bytes(10), checkpoint_bytes(1_000_000)
    assert large - small < 100, f"six checkpoints cost {large - small} more bytes with a 1 MB input"
    assert small < 6 * 2000, f"six checkpoints of a small run cost {small} bytes"
