"""The worker registry: what every live worker serves, and whether it is consuming.

Each worker's main process writes its :class:`WorkerRecord` every ``registry_interval_s`` (a key
that expires three intervals later) and its Redis time in an index. Producers read it to refuse a
run no live worker can serve, operators to list the agents on offer (``wesichain agents``), and a
deployment's probe to tell a healthy worker from one that is up but cannot consume
(``wesichain health``).
"""

from __future__ import annotations

import json
from typing import Any

import redis
from pydantic import BaseModel, Field

from shared.agents import AgentRegistry
from shared.configurable import ConfigSchema, schema_of
from shared.handoffs import handoff_tool
from shared.keys import Keys
from shared.state import DEFAULT_THREAD_POLICY, ThreadPolicy

__all__ = [
    "AgentInfo",
    "HandoffInfo",
    "LiveWorker",
    "ToolInfo",
    "WorkerDirectory",
    "WorkerRecord",
    "agents_served",
    "describe_agents",
]


class ToolInfo(BaseModel):
    """A tool as a worker describes it in the registry."""

    name: str
    description: str
    #: The JSON schema of the tool's arguments.
    parameters: dict[str, Any]
    retry_safe: bool
    timeout_s: float


class HandoffInfo(BaseModel):
    """A handoff an agent declares (``Agent.handoffs``): the agent it may hand the conversation to,
    and the transfer tool its model calls to do it."""

    agent: str = Field(description="The target agent.")
    tool: str = Field(description="The transfer tool the model is offered (``transfer_to_<agent>``).")
    description: str = Field(description="What the model is told about the transfer.")
    filtered: bool = Field(description="The target sees the history through an input filter.")


class AgentInfo(BaseModel):
    """An agent as a worker describes it in the registry."""

    name: str
    version: str
    model: str
    tools: list[ToolInfo] = Field(default_factory=list)
    approval_required: list[str] = Field(default_factory=list)
    #: The metadata keys its prompt templates need: a submit without one is refused.
    variables: list[str] = Field(default_factory=list)
    #: The JSON schema of its final answer (``output_type``), None for free text.
    output_schema: dict[str, Any] | None = None
    #: Older versions whose runs this code serves as they are (``shared/versions.py``).
    compatible_versions: list[str] = Field(default_factory=list)
    #: Older versions whose runs this code takes over through a migration of their state.
    migrates_from: list[str] = Field(default_factory=list)
    #: Its thread policy, for the runs whose request names none (``Agent.thread_policy``).
    thread_policy: ThreadPolicy = DEFAULT_THREAD_POLICY
    #: What assistants may configure of it (``shared/assistants.py``); None: nothing.
    configurable: ConfigSchema | None = None
    #: The agents it may hand the conversation to, in declared order (``shared/handoffs.py``).
    handoffs: list[HandoffInfo] = Field(default_factory=list)


class WorkerRecord(BaseModel):
    """One worker as it last described itself."""

    #: Celery's node name of the worker (``name@host``).
    id: str
    host: str
    pid: int
    queues: list[str]
    pool: str
    concurrency: int
    agents: list[AgentInfo]
    started_at: float
    #: False when the worker is up but cannot take messages from the broker.
    consuming: bool
    #: What the consumer is doing: consuming, saturated (every slot busy), or why it is not consuming.
    consumer_state: str
    #: How durably the run state's Redis keeps acknowledged writes (``RunStore.persistence``).
    redis_persistence: str = "unknown"
    #: Asked to drain (``wesichain workers drain``): it takes no new runs, and stops once no queued
    #: or running run is pinned to a version it serves.
    draining: bool = False
    #: Slots running a task when the record was written (Celery's active requests).
    busy: int = 0


class LiveWorker(BaseModel):
    """A worker's record and how long ago it was written."""

    record: WorkerRecord
    #: Seconds since its last heartbeat, by Redis's clock.
    age_s: float


def describe_agents(registry: AgentRegistry) -> list[AgentInfo]:
    agents = []
    for name in registry.names:
        agent = registry.get(name)
        tools = [
            ToolInfo(
                name=t.name,
                description=t.description,
                parameters=t.spec().parameters,
                retry_safe=t.retry_safe,
                timeout_s=t.timeout_s,
            )
            for t in agent.tools
        ]
        agents.append(
            AgentInfo(
                name=agent.name,
                version=agent.version,
                model=agent.model,
                tools=tools,
                approval_required=sorted(agent.approval_required),
                variables=sorted(agent.variables),
                output_schema=agent.output.schema_ if agent.output is not None else None,
                compatible_versions=list(agent.compatible_versions),
                migrates_from=sorted(agent.migrate_from or {}),
                thread_policy=agent.thread_policy,
                configurable=schema_of(agent),
                handoffs=[
                    HandoffInfo(
                        agent=h.agent,
                        tool=h.name,
                        description=handoff_tool(h).description,
                        filtered=h.input_filter is not None,
                    )
                    for h in agent.handoff_targets
                ],
            )
        )
    return agents


class WorkerDirectory:
    """Reads the registry."""

    def __init__(self, client: redis.Redis, keys: Keys, interval_s: float) -> None:
        self.redis = client
        self.keys = keys
        self.interval_s = interval_s

    def live(self) -> list[LiveWorker]:
        """Workers whose last heartbeat is at most three intervals old, newest first."""
        seconds, micros = self.redis.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        horizon = now_ms - 3 * self.interval_s * 1000
        entries: list[Any] = self.redis.zrevrangebyscore(
            self.keys.workers(), "+inf", horizon, withscores=True
        )
        if not entries:
            return []
        ids = [_text(worker_id) for worker_id, _ in entries]
        raw = self.redis.mget([self.keys.worker(i) for i in ids])
        live = []
        for (_, score), record in zip(entries, raw, strict=True):
            if record is not None:
                live.append(
                    LiveWorker(
                        record=WorkerRecord.model_validate(json.loads(record)),
                        age_s=(now_ms - float(score)) / 1000,
                    )
                )
        return live

    def agents(self) -> dict[str, AgentInfo]:
        """Every agent some live, consuming worker serves, by name."""
        return agents_served(self.live())

    def consumers_of(self, queue: str) -> list[WorkerRecord]:
        return [w.record for w in self.live() if queue in w.record.queues and w.record.consuming]


def agents_served(live: list[LiveWorker]) -> dict[str, AgentInfo]:
    """Every agent some of the ``live`` workers serves while consuming, by name."""
    found: dict[str, AgentInfo] = {}
    for worker in live:
        if worker.record.consuming or worker.record.consumer_state == "saturated":
            for agent in worker.record.agents:
                found.setdefault(agent.name, agent)
    return found


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
