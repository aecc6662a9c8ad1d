"""What a pipeline run looks like from outside: its status, each step and each child run."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, Field

from shared.pipeline.store import PipelineMeta, PipelineStore, child_run_id

__all__ = ["ChildStatus", "PipelineStatus", "PipelineSummary", "StepStatus", "pipeline_status", "summary_of"]

M = TypeVar("M", bound=BaseModel)


class ChildStatus(BaseModel):
    """One item of a step: its child run (of its latest attempt) and how it stands."""

    item: int
    run_id: str | None
    attempt: int = 0
    #: ``waiting`` (not started), ``running``, ``completed``, ``failed`` or ``skipped``.
    status: str
    error: dict[str, Any] | None = None


class StepStatus(BaseModel):
    seq: int
    name: str
    kind: str
    agent: str | None
    #: The pipeline the step belongs to (a branch moves a run into another pipeline).
    pipeline: str
    #: Branches taken on the way to this step: ``{"branch", "case", "to"}``.
    via: list[dict[str, str]] = Field(default_factory=list)
    total: int
    done: int
    children: list[ChildStatus]


class PipelineStatus(BaseModel):
    pipeline_id: str
    name: str
    #: ``running``, ``completed``, ``failed`` or ``cancelled``.
    status: str
    input: str
    tenant: str | None = None
    #: The queue namespace of its child runs and tasks; None: the default queues.
    namespace: str | None = None
    #: The last step's value as JSON (a map's: the list of its values), once completed.
    output: Any = None
    #: Why it failed: the failing child's error, the step, the item and the child's run id.
    error: dict[str, Any] | None = None
    created_at: float
    finished_at: float | None = None
    steps: list[StepStatus]

    @property
    def terminal(self) -> bool:
        return self.status != "running"

    def output_as(self, output_type: type[M]) -> M | None:
        return None if self.output is None else output_type.model_validate(self.output)


class PipelineSummary(BaseModel):
    """A pipeline run in a listing: where it stands, without its steps' child runs (those are in
    its full status)."""

    pipeline_id: str
    name: str
    #: ``running``, ``completed``, ``failed`` or ``cancelled``.
    status: str
    input: str
    tenant: str | None = None
    #: The queue namespace of its child runs and tasks; None: the default queues.
    namespace: str | None = None
    #: The step it is at, counting from 0 (branches included; -1: not started yet).
    step: int = Field(description="The step it is at, counting from 0 (branches included; -1: not started).")
    #: The pipeline that step belongs to (a branch moves a run into another pipeline).
    at: str = Field(description="The pipeline the current step belongs to (a branch moves a run to another).")
    #: Items of the current step that ended, and how many it has.
    done: int
    total: int
    error: dict[str, Any] | None = None
    created_at: float
    finished_at: float | None = None


def summary_of(meta: PipelineMeta) -> PipelineSummary:
    return PipelineSummary(
        pipeline_id=meta.public_id,
        name=meta.name,
        status=meta.status,
        input=meta.input,
        tenant=meta.tenant,
        namespace=meta.namespace,
        step=meta.seq,
        at=meta.target,
        done=meta.done,
        total=meta.total,
        error=meta.error,
        created_at=meta.created_at,
        finished_at=meta.finished_at,
    )


def pipeline_status(store: PipelineStore, pipeline_id: str) -> PipelineStatus | None:
    meta = store.meta(pipeline_id)
    if meta is None:
        return None
    steps = []
    for seq, step in sorted(store.steps(pipeline_id).items()):
        results = store.results(pipeline_id, seq)
        children = store.children(pipeline_id, seq)
        attempts = store.attempts(pipeline_id, seq)
        started = meta.started if seq == meta.seq else int(step["total"])
        rows = []
        for item in range(int(step["total"])):
            attempt = attempts.get(item, 0)
            result = results.get(item)
            if result is not None:
                rows.append(
                    ChildStatus(
                        item=item,
                        run_id=result.get("run_id"),
                        attempt=attempt,
                        status=result["status"],
                        error=result.get("error"),
                    )
                )
                continue
            run_id = child_run_id(pipeline_id, seq, item, attempt)
            live = item < started and children.get(item) == run_id
            rows.append(
                ChildStatus(
                    item=item,
                    run_id=run_id if live else None,
                    attempt=attempt,
                    status="running" if live else "waiting",
                )
            )
        steps.append(
            StepStatus(
                seq=seq,
                name=step["name"],
                kind=step["kind"],
                agent=step.get("agent"),
                pipeline=step["pipeline"],
                via=step.get("via", []),
                total=int(step["total"]),
                done=len(results),
                children=rows,
            )
        )
    return PipelineStatus(
        pipeline_id=meta.public_id,
        name=meta.name,
        status=meta.status,
        input=meta.input,
        tenant=meta.tenant,
        namespace=meta.namespace,
        output=meta.output,
        error=meta.error,
        created_at=meta.created_at,
        finished_at=meta.finished_at,
        steps=steps,
    )
