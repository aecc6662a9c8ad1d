"""What the API takes and answers (the OpenAPI document's schemas)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.configurable import ASSISTANT_NAME_PATTERN
from shared.queues import MAX_NAMESPACE_CHARS, NAMESPACE_PATTERN
from shared.request import MAX_NAME_CHARS, NAME_PATTERN, NOT_BLANK, RunRequest
from shared.state import Callback, ThreadPolicy

# The answers the HTTP clients read too live in shared.wire (the clients may not import the API);
# they stay importable from here, where the rest of the API's schemas are (explicit re-exports).
from shared.wire import AgentView as AgentView
from shared.wire import PipelineList as PipelineList
from shared.wire import RunChildren as RunChildren
from shared.wire import RunList as RunList
from shared.wire import RunView as RunView
from shared.wire import VersionList as VersionList
from shared.wire import VersionView as VersionView
from shared.wire import run_view as run_view

__all__ = [
    "AgentList",
    "CheckpointList",
    "DecisionBody",
    "DenyBody",
    "EventPage",
    "Health",
    "Readiness",
    "SubmitBody",
    "namespace_field",
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
    thread_policy: ThreadPolicy | None = Field(
        default=None, description=RunRequest.model_fields["thread_policy"].description
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
    assistant: str | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        pattern=ASSISTANT_NAME_PATTERN,
        description=RunRequest.model_fields["assistant"].description,
    )
    assistant_version: int | None = Field(
        default=None, ge=1, description=RunRequest.model_fields["assistant_version"].description
    )


class DenyBody(BaseModel):
    """``POST /v1/runs/{id}/deny``: an optional note the model sees."""

    model_config = ConfigDict(extra="forbid")

    note: str = Field(default="", max_length=2000)


class DecisionBody(DenyBody):
    """``POST /v1/runs/{id}/approve``: an optional note the model sees, and whether it holds for
    the rest of the run."""

    always: bool = Field(default=False, description="The same tools need no approval again in this run.")


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


class AgentList(BaseModel):
    agents: list[AgentView]


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    ready: bool
    redis: bool
    queues: dict[str, int] = Field(description="Live consuming workers per queue.")
    problems: list[str]
