"""The HTTP API's answers that its clients read back: a run, a page of runs or pipeline runs, an agent.

Both sides import them from here: the API (``producer.api``) to answer with them, the HTTP clients
(``producer.api_client``) to parse what it answered, so neither imports the other for its wire
format. ``producer.api.models`` re-exports them with the rest of the API's schemas.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from shared.errors import RunErrorInfo
from shared.llm.base import Usage
from shared.messages import ToolCall
from shared.pipeline.status import PipelineSummary
from shared.pipeline.store import public_pipeline_id
from shared.state import (
    Approval,
    Callback,
    CallbackState,
    EvalLink,
    ForkOrigin,
    ParentLink,
    PhaseRun,
    PipelineLink,
    RunHead,
    RunLink,
    RunStatus,
    ThreadPolicy,
)
from shared.workers import AgentInfo

__all__ = [
    "AgentView",
    "HandoffView",
    "PipelineList",
    "RunChildren",
    "RunList",
    "RunView",
    "VersionList",
    "VersionView",
    "run_view",
]


class HandoffView(BaseModel):
    """One handoff of a run, as the API shows it (``docs/agents.md#handoffs``)."""

    from_agent: str
    to_agent: str
    to_version: str = Field(description="The version of the target agent the run went on at.")
    step: int = Field(description="The step whose reply asked for it; the target's first step is the next.")
    call_id: str = Field(description="The model's transfer call.")


class RunView(BaseModel):
    """A run as the API shows it."""

    run_id: str
    agent: str
    agent_version: str
    model: str
    status: RunStatus = Field(
        description="queued, running, awaiting_approval, completed, failed or interrupted."
    )
    phase: str = Field(description="The state machine's phase (finer than status).")
    step: int
    version: int = Field(description="Commits so far (a checkpoint per version).")
    input: str
    thread_id: str | None
    thread_policy: ThreadPolicy | None = Field(
        default=None, description="The thread policy the request chose; null: the agent's."
    )
    waiting_for_run: str | None = Field(
        default=None,
        description="While the run waits, parked, for its thread's previous run to end: that run's id.",
    )
    metadata: dict[str, Any]
    callback: Callback | None
    current_agent: str = Field(
        default="",
        description="The agent the run goes on under: ``agent``, or its last handoff's target.",
    )
    handoffs: list[HandoffView] = Field(
        default_factory=list, description="The run's handoffs between agents, oldest first."
    )
    namespace: str | None = Field(
        default=None, description="The run's queue namespace; null: the default queues."
    )
    assistant: str | None = Field(default=None, description="The assistant configuring the run's agent.")
    assistant_version: int | None = Field(
        default=None, description="The assistant's version the run was pinned to when it was created."
    )
    pending_calls: list[ToolCall] = Field(
        description="The tool calls of the current step (acting, or parked)."
    )
    approval: Approval | None = Field(description="What a parked run waits on.")
    max_steps: int
    steps_used: int
    answer: str | None
    truncated: bool = Field(
        default=False,
        description="The answer was cut at the model's output token limit and accepted as it was.",
    )
    output: Any = Field(
        default=None, description="The answer as JSON, for agents with a structured output type."
    )
    state: dict[str, Any] | None = Field(
        default=None, description="The run's custom state, for agents that declare a state type."
    )
    error: RunErrorInfo | None
    usage: Usage
    ran: PhaseRun | None = Field(
        default=None,
        description="The phase delivery that committed this version (worker, claim time, attempt).",
    )
    created_at: float
    updated_at: float
    callback_delivery: CallbackState | None = Field(
        default=None, description="How the completion callback went so far (attempts, last error)."
    )
    waiting_for: str | None = Field(
        default=None,
        description="Why a queued or running run is not moving, when the worker registry can tell"
        " (e.g. `waiting for run R of its thread to end` (see `waiting_for_run`), or `waiting for a"
        " worker serving research v1`: no live worker serves the agent version the run is pinned"
        " to, so it waits, holding nothing, until one does); null: nothing to say"
        " (a live worker can take it, or it ended, or it is parked). Not filled in checkpoints.",
    )
    fork: ForkOrigin | None = Field(
        default=None, description="The run and checkpoint this run was forked from; null: not a fork."
    )
    parent: ParentLink | None = Field(
        default=None,
        description="The run (and its step and subagent call) this run answers to; null: a top-level"
        " run. Its own subagent runs are at ``/v1/runs/{run_id}/children``.",
    )
    link: RunLink | None = Field(
        default=None,
        description="The pipeline item (``kind`` pipeline: ``pipeline_id`` as its tenant knows it, at"
        " ``/v1/pipelines/{pipeline_id}``) or eval case (``kind`` eval) the runtime started this run"
        " for; null: neither. Only the runtime sets it.",
    )


def run_view(
    head: RunHead,
    callback_delivery: CallbackState | None = None,
    waiting_for: str | None = None,
    waiting_for_run: str | None = None,
) -> RunView:
    return RunView(
        run_id=head.run_id,
        agent=head.agent,
        agent_version=head.agent_version,
        model=head.model,
        status=head.status,
        phase=head.phase.value,
        step=head.step,
        version=head.version,
        input=head.input,
        thread_id=head.thread_id,
        thread_policy=head.thread_policy,
        waiting_for_run=waiting_for_run,
        metadata=head.metadata,
        callback=head.callback,
        current_agent=head.active_agent,
        handoffs=[
            HandoffView(
                from_agent=h.from_agent,
                to_agent=h.to_agent,
                to_version=h.to_version,
                step=h.step,
                call_id=h.call_id,
            )
            for h in head.handoffs
        ],
        namespace=head.namespace,
        assistant=head.assistant,
        assistant_version=head.assistant_version,
        pending_calls=head.pending_calls,
        approval=head.approval,
        max_steps=head.max_steps,
        steps_used=head.steps_used,
        answer=head.answer,
        truncated=head.truncated,
        output=head.output,
        state=head.state,
        error=head.error,
        usage=head.usage,
        ran=head.ran,
        created_at=head.created_at,
        updated_at=head.updated_at,
        callback_delivery=callback_delivery,
        waiting_for=waiting_for,
        fork=head.fork,
        parent=head.parent,
        link=_public_link(head),
    )


def _public_link(head: RunHead) -> PipelineLink | EvalLink | None:
    """The run's link as its tenant may follow it: a pipeline by the id the tenant gave it."""
    link = head.link
    if isinstance(link, PipelineLink):
        return link.model_copy(update={"pipeline_id": public_pipeline_id(head.tenant, link.pipeline_id)})
    return link


class RunChildren(BaseModel):
    """A run's subagent runs, in the order its steps started them (each is the caller's run)."""

    runs: list[RunView]


class RunList(BaseModel):
    """A page of runs, newest first."""

    runs: list[RunView]
    next_cursor: str | None = Field(description="Pass as ``cursor`` for the next page; null: no more.")


class PipelineList(BaseModel):
    """A page of pipeline runs, newest first."""

    pipelines: list[PipelineSummary]
    next_cursor: str | None = Field(description="Pass as ``cursor`` for the next page; null: no more.")


class AgentView(AgentInfo):
    workers: int = Field(description="Live workers that serve it.")


class VersionView(BaseModel):
    """One agent version in the pool: its live workers and the caller's live runs pinned to it."""

    agent: str
    version: str
    workers: int = Field(
        description="Live workers that serve its runs (its own code, or code declaring it compatible"
        " or migrating from it)."
    )
    draining: int = Field(description="Of those, the ones draining (they take no new runs).")
    active_runs: int = Field(description="The caller's queued or running runs pinned to it.")
    parked_runs: int = Field(
        description="The caller's parked runs pinned to it (awaiting approval or subagents)."
    )
    waiting: bool = Field(
        description="The caller has queued or running runs of it and no live worker serves it: they"
        " wait for one."
    )


class VersionList(BaseModel):
    """Every agent version live workers serve or the caller's live runs are pinned to."""

    versions: list[VersionView]
