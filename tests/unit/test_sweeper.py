"""The sweeper against a real redis-server: what it hands on, under which epoch, what it leaves
waiting, its poison bound, its lock, and the broker probe against messages Celery really wrote."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterator

import pytest
import redis
from celery import Celery
from kombu.connection import Connection
from kombu.entity import Queue
from redis.backoff import NoBackoff
from redis.retry import Retry

from shared import fsm, protocol
from shared.agents import load_registry
from shared.llm.base import Usage
from shared.messages import SystemMessage, ToolCall, UserMessage
from shared.settings import QUEUE_MODEL, QUEUE_TOOLS, Settings, celery_config
from shared.state import Phase, RunHead, TaskSpec
from shared.store import CallClaim, Claim, Due, PhaseClaim, RunStore, Stale
from shared.tasks import start_task, task_for
from tests.harness import RedisServer, wait_until
from worker.broker_probe import Located, RedisQueues
from worker.heartbeat import Heartbeat
from worker.hooks import Hooks
from worker.runtime import Runtime
from worker.sweeper import Sweeper


class FakeBroker:
    """Says where it holds task ids: what the sweeper asks a real broker (tested below)."""

    def __init__(self) -> None:
        self.held: set[str] = set()
        self.delivered: set[str] = set()
        self.asked: list[set[str]] = []
        self.queues: list[set[str]] = []

    def locate(self, task_ids: Collection[str], queues: Collection[str] = ()) -> Located | None:
        self.asked.append(set(task_ids))
        self.queues.append(set(queues))
        return Located(frozenset(set(task_ids) & self.held), frozenset(set(task_ids) & self.delivered))


@pytest.fixture
def rt(redis_server: RedisServer) -> Iterator[Runtime]:
    client = redis_server.client()
    settings = Settings(prefix=f"sw-{uuid.uuid4().hex[:8]}:", max_phase_attempts=3, lease_s=0.3)
    store = RunStore(client, settings)
    sent: list[TaskSpec] = []
    runtime = Runtime(
        store=store,
        agents=load_registry("tests.agents_fixture"),
        send=sent.append,
        settings=settings,
        heartbeat=Heartbeat(store, interval_s=1.0),
        hooks=Hooks(),
    )
    runtime.sent = sent  # type: ignore[attr-defined]
    yield runtime
    client.close()


def sent(rt: Runtime) -> list[TaskSpec]:
    return rt.sent  # type: ignore[attr-defined, no-any-return]


def thinking_run(rt: Runtime, namespace: str | None = None) -> RunHead:
    idle = RunHead.new_idle(uuid.uuid4().hex, "direct", "hi", namespace=namespace)
    assert rt.store.create(idle, [start_task(idle.run_id, namespace=namespace)])
    start = fsm.Idle(idle).start(
        [SystemMessage(content="s"), UserMessage(content="hi")],
        agent_version="1",
        model="scripted:direct",
        max_steps=3,
    )
    held = rt.store.claim_phase(PhaseClaim(idle.run_id, 1, Phase.IDLE, 0, 0), "h:1")
    assert isinstance(held, Claim)
    result = rt.store.commit(idle, start.head, held.ref, start.messages, start.events, task_for(start.head))
    assert result.status == "committed"
    return start.head


def queued_time_over(rt: Runtime, run_id: str) -> None:
    rt.store.redis.hset(rt.store.keys.run(run_id), protocol.QUEUED_UNTIL, 0)
    rt.store.redis.zadd(rt.store.keys.leases_of(run_id), {run_id: 0})


def test_a_phase_waiting_in_the_broker_is_left_alone(rt: Runtime) -> None:
    broker = FakeBroker()
    head = thinking_run(rt)
    think_id = task_for(head)[0].task_id
    broker.held.add(think_id)
    sweeper = Sweeper(rt, broker)
    assert sweeper.sweep() == 0  # its queued time has not run out
    assert broker.asked == []
    for checks in (1, 2, 3):
        queued_time_over(rt, head.run_id)
        assert sweeper.sweep() == 0
        assert broker.asked[-1] == {think_id}
        fields = rt.store.load_raw(head.run_id)
        assert fields[protocol.QUEUED_CHECKS] == str(checks)
    # Waiting in a queue is not poison: nothing published, no epoch bumped, no attempt counted.
    assert sent(rt) == [] and rt.store.load(head.run_id).epoch == 0  # type: ignore[union-attr]
    assert not any(k.startswith("lost:") for k in rt.store.attempts(head.run_id))


def test_a_message_a_dead_worker_holds_is_waited_for_once(rt: Runtime) -> None:
    """Delivered but never claimed: its worker died with it; the broker would give it back only
    after its visibility timeout. One wait (a live worker claims within moments), then hand-on."""
    broker = FakeBroker()
    head = thinking_run(rt)
    broker.delivered.add(task_for(head)[0].task_id)
    sweeper = Sweeper(rt, broker)
    queued_time_over(rt, head.run_id)
    assert sweeper.sweep() == 0 and sent(rt) == []
    queued_time_over(rt, head.run_id)
    assert sweeper.sweep() == 1
    assert [s.arguments["epoch"] for s in sent(rt)] == [1]


def test_the_wait_doubles_up_to_its_cap(rt: Runtime) -> None:
    broker = FakeBroker()
    head = thinking_run(rt)
    broker.held.add(task_for(head)[0].task_id)
    sweeper = Sweeper(rt, broker)
    waits = []
    for _ in range(6):
        queued_time_over(rt, head.run_id)
        sweeper.sweep()
        until = int(rt.store.load_raw(head.run_id)[protocol.QUEUED_UNTIL])
        seconds, micros = rt.store.redis.time()
        waits.append(round((until - (seconds * 1000 + micros // 1000)) / 1000))
    q = rt.settings.queued_lease_s
    assert waits == [
        2 * q,
        4 * q,
        8 * q,
        rt.settings.max_queued_check_s,
        rt.settings.max_queued_check_s,
        rt.settings.max_queued_check_s,
    ]


def test_a_message_gone_from_the_broker_is_published_again(rt: Runtime) -> None:
    head = thinking_run(rt)
    queued_time_over(rt, head.run_id)
    assert Sweeper(rt, FakeBroker()).sweep() == 1
    assert [(s.name, s.arguments["epoch"], s.task_id) for s in sent(rt)] == [
        ("wesichain.think", 1, f"{head.run_id}:v{head.version}:think:e1")
    ]
    assert rt.store.load(head.run_id).epoch == 1  # type: ignore[union-attr]
    stale = rt.store.claim_phase(PhaseClaim(head.run_id, head.version, Phase.THINKING, 0, 1), "h:1")
    assert isinstance(stale, Stale)


def test_a_run_in_a_queue_namespace_is_looked_for_and_published_again_in_its_queues(rt: Runtime) -> None:
    broker = FakeBroker()
    head = thinking_run(rt, namespace="nightly")
    queued_time_over(rt, head.run_id)
    # Missing from the broker (looked for in its namespace's queue of the run's agent version
    # too): sent again, there.
    assert Sweeper(rt, broker).sweep() == 1
    assert broker.queues == [{"nightly.model.direct-v1"}]
    assert [(s.name, s.queue, s.arguments["epoch"]) for s in sent(rt)] == [
        ("wesichain.think", "nightly.model.direct-v1", 1)
    ]


def test_an_expired_claim_is_handed_on_without_asking_the_broker(rt: Runtime) -> None:
    broker = FakeBroker()
    head = thinking_run(rt)
    held = rt.store.claim_phase(PhaseClaim(head.run_id, head.version, Phase.THINKING, 0, 1), "dead:1")
    assert isinstance(held, Claim)
    sweeper = Sweeper(rt, broker)
    wait_until(lambda: sweeper.sweep() == 1, 10, what="the claim to expire and be handed on")
    assert broker.asked == []
    assert [s.arguments["epoch"] for s in sent(rt)] == [1]
    assert (
        "dead:1"
        in rt.store.attempts(head.run_id)[f"err:{protocol.attempts_field(head.version, protocol.RUNNING)}"]
    )


def acting_run(rt: Runtime) -> RunHead:
    """A run at its first step's tool call (``c1``), committed as a think would."""
    thinking = thinking_run(rt)
    held = rt.store.claim_phase(PhaseClaim(thinking.run_id, thinking.version, Phase.THINKING, 0, 1), "h:1")
    assert isinstance(held, Claim)
    act = fsm.Thinking(thinking).act(
        None, [ToolCall(id="c1", name="add", arguments={"a": 1, "b": 2})], Usage()
    )
    result = rt.store.commit(thinking, act.head, held.ref, act.messages, act.events, task_for(act.head))
    assert result.status == "committed"
    return act.head


def test_a_call_handed_on_is_not_handed_on_again_while_its_message_waits(rt: Runtime) -> None:
    """A call whose holder died is handed on once; its expired claim stays (the next delivery must
    know an earlier one may have had its effect) but is not expired work any more: while the new
    message waits in a queue nobody consumes (every worker deaf, or a full Redis), the sweeper
    waits for it in the broker instead of bumping the epoch and publishing it again each sweep."""
    broker = FakeBroker()
    head = acting_run(rt)
    held = rt.store.claim_call(CallClaim(head.run_id, head.version, 0, head.step, "c1"), "dead:1")
    assert isinstance(held, Claim)
    sweeper = Sweeper(rt, broker)
    wait_until(lambda: sweeper.sweep() == 1, 10, what="the call's claim to expire and be handed on")
    (again,) = sent(rt)
    assert (again.name, again.arguments["epoch"], again.task_id) == (
        "wesichain.tool",
        1,
        f"{head.run_id}:v{head.version}:tool:c1:e1",
    )
    broker.held.add(again.task_id)  # waiting in its queue, consumed by nobody
    for _ in range(4):
        queued_time_over(rt, head.run_id)
        assert sweeper.sweep() == 0
    assert broker.asked[-1] == {again.task_id}
    assert len(sent(rt)) == 1 and rt.store.load(head.run_id).epoch == 1  # type: ignore[union-attr]
    # The next delivery still finds the marker: an earlier delivery may have had the call's effect.
    claim = rt.store.claim_call(CallClaim(head.run_id, head.version, 1, head.step, "c1"), "live:1")
    assert isinstance(claim, Claim) and claim.prior == "expired"
    # Its message gone from the broker too: handed on again, as a lost message.
    rt.store.redis.hdel(rt.store.keys.run(head.run_id), protocol.call_claim(head.step, "c1"))
    broker.held.clear()
    queued_time_over(rt, head.run_id)
    assert sweeper.sweep() == 1 and rt.store.load(head.run_id).epoch == 2  # type: ignore[union-attr]


def test_a_phase_whose_messages_keep_vanishing_is_failed_as_poison(rt: Runtime) -> None:
    head = thinking_run(rt)
    sweeper = Sweeper(rt, FakeBroker())
    for _ in range(rt.settings.max_phase_attempts):
        queued_time_over(rt, head.run_id)
        assert sweeper.sweep() == 1
    assert len(sent(rt)) == rt.settings.max_phase_attempts
    queued_time_over(rt, head.run_id)
    sweeper.sweep()
    final = rt.store.load(head.run_id)
    assert final is not None and final.phase is Phase.FAILED
    assert final.error is not None and final.error.kind == "PoisonPhase"
    assert final.error.details["attempts"] == rt.settings.max_phase_attempts + 1
    assert "vanishing" in final.error.details["last_error"]
    assert len(sent(rt)) == rt.settings.max_phase_attempts  # nothing more was published


def test_after_no_sweeper_reached_redis_for_a_while_nothing_is_handed_on_for_a_lease(rt: Runtime) -> None:
    """Claims run out by Redis's clock, which goes on while Redis is down and no holder can renew:
    after a gap in the sweepers' looks, an expired claim is left to its holder for a lease."""
    head = thinking_run(rt)
    held = rt.store.claim_phase(PhaseClaim(head.run_id, head.version, Phase.THINKING, 0, 1), "h:1")
    assert isinstance(held, Claim)
    sweeper = Sweeper(rt, FakeBroker())
    assert sweeper.tick() == 0  # its claim is live
    wait_until(
        lambda: isinstance(seen := rt.store.inspect(head.run_id), Due) and seen.expired,
        10,
        what="the claim to expire",
    )
    keys, r = rt.store.keys, rt.store.redis
    # The sweepers' last look, as if none reached Redis since long before the claim ran out.
    r.set(
        keys.sweeper_seen(), int(r.get(keys.sweeper_seen()) or 0) - 3_000 * int(rt.settings.sweep_interval_s)
    )
    assert sweeper.tick() == 0 and sent(rt) == []
    lease_ms = 1000 * max(rt.settings.lease_s, rt.settings.worker_lease_s)
    assert 0 < r.pttl(keys.sweeper_quiet()) <= lease_ms
    assert sweeper.tick() == 0  # still quiet
    r.delete(keys.sweeper_quiet())  # its lease is over and the holder renewed nothing: it is dead
    assert sweeper.tick() == 1
    assert [s.arguments["epoch"] for s in sent(rt)] == [1]


def test_only_one_sweeper_sweeps_at_a_time(rt: Runtime) -> None:
    head = thinking_run(rt)
    first, second = Sweeper(rt, FakeBroker()), Sweeper(rt, FakeBroker())
    queued_time_over(rt, head.run_id)
    assert first.tick() == 1
    queued_time_over(rt, head.run_id)
    assert second.tick() == 0  # the lock is the first sweeper's
    assert second.sweep_once_and_release() == 0  # celery beat's sweep takes the same lock
    assert first.tick() == 1


def test_parked_and_finished_runs_leave_the_watch_list(rt: Runtime) -> None:
    head = thinking_run(rt)
    held = rt.store.claim_phase(PhaseClaim(head.run_id, head.version, Phase.THINKING, 0, 1), "h:1")
    assert isinstance(held, Claim)
    done = fsm.Thinking(head).complete("ok", head.usage)
    assert rt.store.commit(head, done.head, held.ref, done.messages, done.events).status == "committed"
    rt.store.redis.zadd(rt.store.keys.leases_of(head.run_id), {head.run_id: 0})
    assert Sweeper(rt, FakeBroker()).sweep() == 0
    assert rt.store.redis.zscore(rt.store.keys.leases_of(head.run_id), head.run_id) is None
    assert sent(rt) == []


def test_redis_unavailable_does_not_kill_the_sweeper(rt: Runtime) -> None:
    broken = Runtime(
        store=RunStore(
            redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)), rt.settings
        ),
        agents=rt.agents,
        send=lambda spec: None,
        settings=rt.settings,
        heartbeat=rt.heartbeat,
        hooks=Hooks(),
    )
    failures: list[Exception] = []

    class Counting(Sweeper):
        def tick(self) -> int:
            try:
                return super().tick()
            except Exception as exc:
                failures.append(exc)
                raise

    sweeper = Counting(broken, FakeBroker())
    sweeper.interval_s = 0.05
    sweeper.start()
    try:
        wait_until(lambda: len(failures) >= 3, 10, what="three failed sweeps")
        assert all(isinstance(e, redis.ConnectionError) for e in failures)
        assert sweeper._thread is not None and sweeper._thread.is_alive()
    finally:
        sweeper.stop()


# -- the broker probe, on the messages Celery and kombu really write -----------------------------------


def test_the_probe_finds_queued_and_delivered_messages(redis_server: RedisServer) -> None:
    url = redis_server.url.replace("/0", "/5")
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    app = Celery("probe-test", set_as_current=False)
    app.conf.update(celery_config(Settings(redis_url=url)))
    ids = [f"run-{i}:v2:think" for i in range(1200)]  # more than one scan chunk
    for task_id in ids:
        app.send_task("wesichain.think", kwargs={"run_id": "x"}, task_id=task_id)
    app.send_task("wesichain.tool", kwargs={"run_id": "x"}, task_id="run-t:v3:tool:c1")
    probe = RedisQueues(client, [QUEUE_MODEL, QUEUE_TOOLS])
    wanted = {ids[0], ids[-1], ids[600], "run-t:v3:tool:c1", "never-sent"}
    assert probe.locate(wanted) == Located(frozenset(wanted - {"never-sent"}), frozenset())

    # A message a consumer took but has not acknowledged is held in the unacked hash: delivered.
    with Connection(url) as conn:
        queue = conn.SimpleQueue(Queue(QUEUE_TOOLS, routing_key=QUEUE_TOOLS), no_ack=False)
        message = queue.get(timeout=5)
        assert message.headers["id"] == "run-t:v3:tool:c1"
        assert client.llen(QUEUE_TOOLS) == 0
        assert probe.locate({"run-t:v3:tool:c1"}) == Located(frozenset(), frozenset({"run-t:v3:tool:c1"}))
        message.ack()
        assert probe.locate({"run-t:v3:tool:c1"}) == Located(frozenset(), frozenset())
        queue.close()
    # A run's queue namespace: its message is found only when the probe is told to look there.
    app.send_task("wesichain.tool", kwargs={"run_id": "n"}, task_id="run-n:v3:tool:c1", queue="nightly.tools")
    assert probe.locate({"run-n:v3:tool:c1"}) == Located(frozenset(), frozenset())
    found = probe.locate({"run-n:v3:tool:c1"}, {"nightly.tools"})
    assert found == Located(frozenset({"run-n:v3:tool:c1"}), frozenset())
    client.flushdb()
    client.close()


class CountingRepairs:
    """An eval or pipeline repair that counts its ticks (what the sweeper asks of ``EvalPool``)."""

    def __init__(self) -> None:
        self.ticks = 0

    def tick(self) -> int:
        self.ticks += 1
        return 0


def test_eval_and_pipeline_repairs_are_built_only_once_redis_holds_one(rt: Runtime) -> None:
    evals, pipelines = CountingRepairs(), CountingRepairs()
    built: list[str] = []

    def make_evals() -> CountingRepairs:
        built.append("evals")
        return evals

    def make_pipelines() -> CountingRepairs:
        built.append("pipelines")
        return pipelines

    sweeper = Sweeper(rt, FakeBroker(), make_evals, make_pipelines)
    assert sweeper.sweep() == 0
    assert built == []  # no eval, no pipeline run: their code is never asked for
    keys = rt.store.keys
    rt.store.redis.sadd(keys.evals_active(), "e1")
    sweeper.sweep()
    assert (built, evals.ticks, pipelines.ticks) == (["evals"], 1, 0)
    rt.store.redis.zadd(keys.pipes_index(), {"p1": 1})
    sweeper.sweep()
    assert (built, evals.ticks, pipelines.ticks) == (["evals", "evals", "pipelines"], 2, 1)
