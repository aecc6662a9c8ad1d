"""The sweeper's repairs of an eval, on the in-process Redis stand-in: a case run whose creator
died is created once, an eval with room gets a pump, running runs are looked at in turn; and a
scoring whose judge finds no provider capacity is sent again later instead of waiting."""

from __future__ import annotations

from typing import Any, cast

import fakeredis
from celery import Celery

from producer.client import Client
from shared import protocol
from shared.agents import AgentRegistry
from shared.evals.dataset import Case
from shared.evals.spec import parse_spec
from shared.evals.store import BOUND, Item, run_id_of
from shared.evals.tasks import TASK_EVAL_PUMP, TASK_EVAL_SCORE
from shared.limits import Grant, ProviderLimit, RateLimiter
from shared.llm.base import Usage
from shared.llm.scripted import ScriptedModel, reply
from shared.settings import Settings
from shared.state import EvalLink, Phase, TaskSpec
from shared.store import RunStore
from shared.tasks import TASK_START
from shared.webhooks import outcome
from worker.evals import EvalPool
from worker.throttle import ModelGate


class Sent:
    """Records what would go to the broker (both the client's and the pool's sends)."""

    def __init__(self) -> None:
        self.tasks: list[TaskSpec] = []

    def send_task(self, name: str, kwargs: dict[str, Any] | None = None, task_id: str = "", **_: Any) -> None:
        self.tasks.append(TaskSpec(name=name, task_id=task_id, arguments=kwargs or {}))

    def names(self) -> list[str]:
        return [t.name for t in self.tasks]


def pool() -> tuple[EvalPool, Sent]:
    settings = Settings(redis_url="redis://127.0.0.1:1/0", lease_s=2.0)
    store = RunStore(fakeredis.FakeRedis(decode_responses=True), settings)
    sent = Sent()
    client = Client(settings, app=cast(Celery, sent), store=store)
    client.memory_guard.check = lambda: None  # type: ignore[method-assign]  # no INFO on the stand-in
    return EvalPool(client, sent.tasks.append, AgentRegistry()), sent


SPEC = parse_spec(
    {
        "name": "r",
        "dataset": "d.jsonl",
        "variants": [{"agent": "doubler"}],
        "scorers": [{"kind": "exact"}],
        "concurrency": 2,
    }
)


def test_a_slot_whose_creator_died_gets_its_run_once_and_the_eval_a_pump() -> None:
    evals, sent = pool()
    cases = [Case(id=f"c{i}", input=f"double {i}") for i in range(3)]
    assert evals.evals.create("e", SPEC, cases, "d.jsonl")
    # A pump took two slots and died before creating their runs: their leases are over at once.
    taken = evals.evals.acquire("e", SPEC, 2, lease_s=0.0).items
    assert taken == [Item(0, 0, 0), Item(0, 1, 0)]
    assert evals.tick() == 2
    for item in taken:
        head = evals.runs.load(run_id_of("e", item))
        assert head is not None and head.phase is Phase.IDLE
        assert head.link == EvalLink(eval_id="e", item=str(item)) and head.metadata == {}
    assert sent.names() == [TASK_START, TASK_START]
    assert all(score >= BOUND for _, score in evals.evals.slots("e"))
    # The cap is full, the runs are going: nothing to repair, and nothing is created twice.
    assert evals.tick() == 0 and sent.names() == [TASK_START, TASK_START]
    assert evals.start(evals.evals.meta("e"), taken[0]) == 0  # a late creator finds its run
    # A slot given back (a result recorded elsewhere) leaves room: the next sweep sends a pump.
    evals.evals.redis.zrem(evals.evals.keys.eval_slots("e"), str(taken[0]))
    assert evals.tick() == 1 and sent.names()[-1] == TASK_EVAL_PUMP


def test_running_case_runs_are_looked_at_once_per_recheck_interval() -> None:
    evals, sent = pool()
    evals.evals.create("e", SPEC, [Case(id="c0", input="double 1")], "d.jsonl")
    evals.pump("e")
    looked: list[str] = []
    load = evals.runs.load

    def counting_load(run_id: str) -> Any:
        looked.append(run_id)
        return load(run_id)

    evals.runs.load = counting_load  # type: ignore[method-assign]
    evals.recheck_s = 0.0
    evals.tick()
    assert looked == [run_id_of("e", Item(0, 0, 0))]  # still IDLE: nothing to do
    evals.recheck_s = 3600.0
    evals.tick()
    assert looked == [run_id_of("e", Item(0, 0, 0))]  # looked at just now: not again


JUDGED = parse_spec(
    {
        "name": "j",
        "dataset": "d.jsonl",
        "variants": [{"agent": "doubler"}],
        "scorers": [{"kind": "judge", "model": "scripted:judge", "rubric": "Is it right?"}],
    }
)


def completed_case_run(evals: EvalPool, eval_id: str, item: Item, answer: str) -> dict[str, Any]:
    """Create the item's case run as the pool does, then store it completed with ``answer`` (as
    its last commit would); returns its outcome, what its completion callback carries."""
    assert evals.start(evals.evals.meta(eval_id), item) == 1
    run_id = run_id_of(eval_id, item)
    head = evals.runs.load(run_id)
    assert head is not None
    done = head.model_copy(
        update={"phase": Phase.COMPLETED, "version": 4, "answer": answer, "usage": Usage(input_tokens=1)}
    )
    evals.runs.redis.hset(evals.runs.keys.run(run_id), protocol.BODY, done.dump_body())
    return outcome(done)


def test_a_judge_without_provider_capacity_defers_the_scoring_to_a_task_sent_later() -> None:
    evals, sent = pool()
    judged: list[str] = []

    def judge(messages: Any) -> Any:
        judged.append("asked")
        return reply('{"score": 1, "reason": "right"}')

    evals.agents.add_model("judge", ScriptedModel(judge))
    limit = ProviderLimit(concurrency=1)
    limiter = RateLimiter(evals.runs.redis, evals.runs.keys, lease_s=30.0)
    evals.gate = ModelGate(limiter, {"scripted:judge": limit}, renew_s=10.0)
    evals.evals.create("e", JUDGED, [Case(id="c0", input="double 1", expected="2")], "d.jsonl")
    item = Item(0, 0, 0)
    ended = completed_case_run(evals, "e", item, "2")
    sent.tasks.clear()  # the case run's start
    # Another worker's think holds the only slot of the judge's model: the judge is not asked.
    other = limiter.acquire("scripted:judge", limit, 1)
    assert isinstance(other, Grant)
    assert evals.score(ended) is None
    assert judged == [] and evals.evals.result("e", item) is None
    (later,) = sent.tasks
    assert later.name == TASK_EVAL_SCORE and later.args == [ended] and 0.2 <= later.countdown <= 1.0
    assert evals.evals.judge_waits("e") == 1
    # The scoring was given back: the task sent later claims it, and with the slot free, scores.
    limiter.release(other)
    result = evals.score(later.args[0])
    assert result is not None and judged == ["asked"]
    assert [(s.value, s.explanation, s.error) for s in result.scores] == [(1.0, "right", False)]
    assert evals.evals.result("e", item) == result
    assert limiter.in_use("scripted:judge") == 0  # the judge's slot was given back
