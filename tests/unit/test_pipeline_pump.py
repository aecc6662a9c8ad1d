"""A capped map's pump, driven in this process on a real redis-server: ends close together share
one pump under the step's lease, and a pump killed while it holds the lease loses nothing (its
lease lapses, the next end pumps, the sweeper creates what it took), starts nothing twice and
never exceeds the cap.

Each child run's end is what its completion callback hands the pool: the stored run, ended.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest

import worker.pipelines as pipelines
from producer.client import Client
from shared.agents import Agent, AgentRegistry
from shared.llm.scripted import ScriptedModel, reply
from shared.pipeline.definition import Pipeline, Step
from shared.pipeline.store import PipelineMeta, child_run_id
from shared.state import Phase, TaskSpec
from tests.broker import Settings
from tests.harness import RedisServer, wait_until
from worker.pipelines import PipelinePool

CAP = 3
ITEMS = 10


def _registry() -> AgentRegistry:
    registry = AgentRegistry()
    registry.add_model("w", ScriptedModel([reply("unused")]))
    registry.add(Agent(name="w", model="scripted:w", system_prompt="Work."))
    registry.add_pipeline(Pipeline("lines").map("w", over=lambda text: text.split(","), concurrency=CAP))
    return registry


@pytest.fixture
def pool(redis_server: RedisServer) -> Iterator[PipelinePool]:
    client = Client(Settings(redis_url=redis_server.url, prefix=f"pump-{uuid.uuid4().hex[:8]}:"))
    sent: list[TaskSpec] = []
    yield PipelinePool(client, _registry(), sent.append)
    client.close()


def _start(pool: PipelinePool) -> str:
    handle = pool.client.submit_pipeline("lines", ",".join(f"item {i}" for i in range(ITEMS)), check=False)
    pool.advance(handle.pipeline_id, -1)
    return handle.pipeline_id


def _meta(pool: PipelinePool, pipeline_id: str) -> PipelineMeta:
    meta = pool.store.meta(pipeline_id)
    assert meta is not None
    assert meta.started - meta.done <= CAP
    return meta


def _live(pool: PipelinePool, pipeline_id: str) -> list[int]:
    """Items whose child run was created and whose end is not recorded."""
    recorded = pool.store.results(pipeline_id, 0)
    return [
        item
        for item in range(ITEMS)
        if item not in recorded and pool.runs.load(child_run_id(pipeline_id, 0, item, 0)) is not None
    ]


def _end(pool: PipelinePool, pipeline_id: str, item: int) -> None:
    """Item ``item``'s child run completed: what its completion callback hands the pool."""
    head = pool.runs.load(child_run_id(pipeline_id, 0, item, 0))
    assert head is not None
    pool.child_run_ended(head.model_copy(update={"phase": Phase.COMPLETED, "answer": f"done {item}"}))


def _finish(pool: PipelinePool, pipeline_id: str) -> None:
    """End every live child, one after another, until the pipeline run completes."""
    while live := _live(pool, pipeline_id):
        assert len(live) <= CAP
        _end(pool, pipeline_id, live[0])
        _meta(pool, pipeline_id)
    meta = _meta(pool, pipeline_id)
    assert meta.status == "completed"
    assert meta.output == [f"done {i}" for i in range(ITEMS)]
    # One child run per item, never a second attempt's.
    for item in range(ITEMS):
        assert pool.runs.load(child_run_id(pipeline_id, 0, item, 1)) is None
    assert pool.store.children(pipeline_id, 0) == {
        i: child_run_id(pipeline_id, 0, i, 0) for i in range(ITEMS)
    }


def test_an_end_while_another_pumps_leaves_its_room_to_that_pump(
    pool: PipelinePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline_id = _start(pool)
    assert _live(pool, pipeline_id) == [0, 1, 2]
    # Item 1's child ends while item 0's record is creating the child of item 3: its own record
    # answers 'pumping', and the pump of item 0's end starts item 4 in that room too.
    create = pool._create_children
    ended_meanwhile: list[str | None] = []

    def create_while_another_ends(
        meta: PipelineMeta, step: Step, items: Any
    ) -> tuple[int, list[tuple[int, str]]]:
        if not ended_meanwhile:
            head = pool.runs.load(child_run_id(pipeline_id, 0, 1, 0))
            assert head is not None
            ended = head.model_copy(update={"phase": Phase.COMPLETED, "answer": "done 1"})
            answer = ("done 1", None)
            ended_meanwhile.append(
                pool._ended(pipeline_id, step, 0, 1, 0, ended.run_id, "completed", answer, None, True, meta)
            )
        return create(meta, step, items)

    monkeypatch.setattr(pool, "_create_children", create_while_another_ends)
    _end(pool, pipeline_id, 0)
    monkeypatch.undo()
    assert ended_meanwhile == ["pumping"]
    assert _live(pool, pipeline_id) == [2, 3, 4]
    assert pool.store.redis.get(pool.store.keys.pipe_pump(pipeline_id, 0)) is None  # given up
    _finish(pool, pipeline_id)


def test_a_pump_killed_holding_the_lease_loses_nothing_and_starts_nothing_twice(
    pool: PipelinePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipelines, "PUMP_LEASE_MS", 200)
    pipeline_id = _start(pool)
    assert _live(pool, pipeline_id) == [0, 1, 2]

    def killed(*args: object) -> NoReturn:
        raise SystemExit("killed mid-pump")

    # Item 0's record takes the lease and item 3; its worker dies before creating the child.
    monkeypatch.setattr(pool, "_create_children", killed)
    with pytest.raises(SystemExit):
        _end(pool, pipeline_id, 0)
    monkeypatch.undo()
    lease = pool.store.keys.pipe_pump(pipeline_id, 0)
    assert pool.store.redis.get(lease) is not None
    assert _meta(pool, pipeline_id).started == 4
    # While the dead pump's lease lasts, an end leaves its room to it.
    _end(pool, pipeline_id, 1)
    assert _live(pool, pipeline_id) == [2]
    # Once it lapsed, the next end pumps: the room of both ends but what the dead pump took.
    wait_until(lambda: pool.store.redis.get(lease) is None, timeout=30, what="the dead pump's lease to lapse")
    _end(pool, pipeline_id, 2)
    assert _live(pool, pipeline_id) == [4, 5]
    assert _meta(pool, pipeline_id).started - _meta(pool, pipeline_id).done == CAP
    # The sweeper creates item 3's child, taken by the dead pump and never created: once.
    assert pool.tick() >= 1
    assert _live(pool, pipeline_id) == [3, 4, 5]
    assert pool.tick() == 0
    _finish(pool, pipeline_id)
