"""What the API takes and answers (the OpenAPI document's schemas)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.errors import RunErrorInfo
from shared.llm.base import Usage
from shared.messages import ToolCall
from shared.pipeline.status import PipelineSummary
from shared.queues import MAX_NAMESPACE_CHARS, NAMESPACE_PATTERN
from shared.request import MAX_NAME_CHARS, NAME_PATTERN, NOT_BLANK, RunRequest
from shared.state import Approval, Callback, CallbackState, PhaseRun, RunHead, RunStatus
from shared.workers import AgentInfo

__all__ = [
    "AgentList",
    "AgentView",
    "CheckpointList",
    "DecisionBody",
    "DenyBody",
    "EventPage",
    "Health",
    "PipelineList",
    "Readiness",
    "RunList",
    "RunView",
    "SubmitBody",
    "namespace_field",
    "run_view",
]


def namespace_field(what: str) -> Any:
    """The optional ``namespace`` of a body that starts ``what``: its bounds, pattern and rule."""
    return Field(
        default=None,
        min_length=1,
        max_length=MAX_NAMESPACE_CHARS,
        pattern=NAMESPACE_PATTERN,
        description=f"The queue namespace of {what}: NAME sends every task to NAME.model, NAME.tools"
        " and NAME.callbacks, served by `wesichain worker --namespace NAME`, instead of the default"
        " queues (1..48 letters, digits, _ and -; `wesichain` is the default one). A tenant may name"
        " only the namespaces an operator allowed it (`wesichain keys namespaces`): any other is a"
        " 403 `forbidden`.",
    )


class SubmitBody(BaseModel):
    """``POST /v1/runs``: what to run. The run's tenant is the caller's key's."""

    model_config = ConfigDict(extra="forbid")

    agent: str = Field(
        min_length=1,
        max_length=MAX_NAME_CHARS,
        pattern=NAME_PATTERN,
        description=RunRequest.model_fields["agent"].description,
    )
    input: str = Field(pattern=NOT_BLANK, description=RunRequest.model_fields["input"].description)
    thread_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_NAME_CHARS,
        pattern=NAME_PATTERN,
        description=RunRequest.model_fields["thread_id"].description,
    )
    metadata: dict[str, Any] | None = Field(
        default=None, description=RunRequest.model_fields["metadata"].description
    )
    model: str | None = Field(
        default=None,
        max_length=MAX_NAME_CHARS,
        pattern=":",
        description=RunRequest.model_fields["model"].description,
    )
    callback: Callback | None = Field(
        default=None, description=RunRequest.model_fields["callback"].description
    )
    state: dict[str, Any] | None = Field(
        default=None, description=RunRequest.model_fields["state"].description
    )
    namespace: str | None = namespace_field("the run")


class DenyBody(BaseModel):
    """``POST /v1/runs/{id}/deny``: an optional note the model sees."""

    model_config = ConfigDict(extra="forbid")

    note: str = Field(default="", max_length=2000)


class DecisionBody(DenyBody):
    """``POST /v1/runs/{id}/approve``: an optional note the model sees, and whether it holds for
    the rest of the run."""

    always: bool = Field(default=False, description="The same tools need no approval again in this run.")


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
    metadata: dict[str, Any]
    callback: Callback | None
    namespace: str | None = Field(
        default=None, description="The run's queue namespace; null: the default queues."
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


def run_view(head: RunHead, callback_delivery: CallbackState | None = None) -> RunView:
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
        metadata=head.metadata,
        callback=head.callback,
        namespace=head.namespace,
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
    )


class RunList(BaseModel):
    """A page of runs, newest first."""

    runs: list[RunView]
    next_cursor: str | None = Field(description="Pass as ``cursor`` for the next page; null: no more.")


class PipelineList(BaseModel):
    """A page of pipeline runs, newest first."""

    pipelines: list[PipelineSummary]
    next_cursor: str | None = Field(description="Pass as ``cursor`` for the next page; null: no more.")


class CheckpointList(BaseModel):
    """Committed states of a run, in version order, a page at a time."""

    checkpoints: list[RunView]
    next_after_version: int | None = Field(
        default=None, description="Pass as ``after_version`` for the next page; null: no more."
    )


class EventPage(BaseModel):
    """A page of a run's events (for clients that do not stream)."""

    events: list[dict[str, Any]] = Field(
        description="Events in order; each has ``id`` (its stream id), ``kind`` and the event's fields."
    )
    next_after: str = Field(
        description="Pass as ``after`` for the next page (the last id, or the one given)."
    )
    ended: bool = Field(description="The run's end event is in this page (or was before it).")


class AgentView(AgentInfo):
    workers: int = Field(description="Live workers that serve it.")


class AgentList(BaseModel):
    agents: list[AgentView]


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    ready: bool
    redis: bool
    queues: dict[str, int] = Field(description="Live consuming workers per queue.")
    problems: list[str]
