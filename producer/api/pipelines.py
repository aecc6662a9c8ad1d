"""``/v1/pipelines``: start, list, read, cancel a tenant's pipeline runs, and read their events.

A pipeline run of another tenant answers 404, exactly as one that does not exist. Starting one
counts as one submit against the tenant's limits; its child runs are the tenant's runs. A
pipeline run may name a queue namespace its tenant is allowed (as a run may: ``producer/api/namespaces.py``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from producer.api.auth import Caller
from producer.api.errors import ApiError
from producer.api.events import event_cursor
from producer.api.models import PipelineList, namespace_field
from producer.api.namespaces import allowed_namespace
from producer.api.runs import ERRORS, MAX_UNIX_S, Svc, Who
from producer.api.services import Services
from producer.pipelines import MAX_PIPELINE_ID_CHARS, PipelineConflict, PipelineHandle, UnknownPipeline
from shared.errors import ConfigError, InvalidRequest
from shared.pipeline.status import PipelineStatus, summary_of
from shared.request import NOT_BLANK, check_name
from shared.store import CURSOR_PATTERN

__all__ = [
    "PIPELINE_STATUSES",
    "PipelineEvents",
    "PipelineSubmit",
    "cancel_pipeline",
    "get_pipeline",
    "list_pipelines",
    "pipeline_events",
    "router",
    "submit_pipeline",
]

router = APIRouter(prefix="/v1", responses=ERRORS)

#: What a pipeline run's ``status`` may be.
PIPELINE_STATUSES = Literal["running", "completed", "failed", "cancelled"]


class PipelineSubmit(BaseModel):
    """A pipeline run to start."""

    pipeline: str = Field(min_length=1, max_length=200, description="A pipeline the agents module registers.")
    input: str = Field(
        pattern=NOT_BLANK,
        description="The first step's input (JSON of the pipeline's input type, if it has one).",
    )
    pipeline_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PIPELINE_ID_CHARS,
        description="Its id; the same id and request again is the same pipeline run.",
    )
    namespace: str | None = namespace_field("every child run it starts and of its own tasks")


class PipelineEvents(BaseModel):
    """A page of a pipeline run's events, oldest first; ask again with ``after`` = ``last_id``."""

    events: list[dict[str, Any]]
    last_id: str | None


def _owned(services: Services, who: Caller, pipeline_id: str) -> PipelineHandle:
    try:
        check_name("pipeline_id", pipeline_id)
    except InvalidRequest:
        raise ApiError(404, "not_found", f"no pipeline run {pipeline_id[:80]!r}") from None
    handle = services.client.pipeline(pipeline_id, tenant=who.tenant)
    meta = handle.store.meta(handle.pipeline_id)
    if meta is None or meta.tenant != who.tenant:
        raise ApiError(404, "not_found", f"no pipeline run {pipeline_id!r}")
    return handle


@router.post(
    "/pipelines",
    status_code=202,
    response_model=PipelineStatus,
    summary="Start a pipeline run",
    description="Creates the pipeline run and hands it to the workers. 422 for a pipeline the agents"
    " module does not register, or an input that does not fit it; 409 for an id the caller's tenant"
    " used for another request (ids are per tenant: another tenant's same id is another pipeline"
    " run); 403 for a ``namespace`` the caller's tenant is not allowed.",
)
def submit_pipeline(body: PipelineSubmit, services: Svc, who: Who) -> PipelineStatus:
    namespace = allowed_namespace(services.gate, who, body.namespace)
    replay = (
        body.pipeline_id is not None
        and services.client.pipeline(body.pipeline_id, tenant=who.tenant).exists()
    )
    if who.tenant is not None and not replay:
        # A retried submit whose pipeline run exists is answered whatever the limits: it starts nothing.
        services.gate.admit(who.tenant)
    try:
        try:
            handle = services.client.submit_pipeline(
                body.pipeline,
                body.input,
                pipeline_id=body.pipeline_id,
                tenant=who.tenant,
                namespace=namespace,
            )
        except ConfigError:
            # This process cannot import the agents module: the workers check the name (an unknown
            # one ends the pipeline run failed, UnknownPipeline).
            handle = services.client.submit_pipeline(
                body.pipeline,
                body.input,
                pipeline_id=body.pipeline_id,
                tenant=who.tenant,
                check=False,
                namespace=namespace,
            )
    except UnknownPipeline as exc:
        raise ApiError(422, "unknown_pipeline", exc.message, details={"pipeline": body.pipeline}) from None
    except PipelineConflict as exc:
        raise ApiError(409, "conflict", exc.message) from None
    except InvalidRequest as exc:
        raise ApiError(422, "invalid_request", exc.message) from None
    return handle.status()


@router.get(
    "/pipelines",
    response_model=PipelineList,
    summary="List pipeline runs, newest first",
    description="The caller's pipeline runs; filters combine; pages follow ``next_cursor``. A page may"
    " hold fewer than ``limit`` pipeline runs and still have a ``next_cursor`` (each page reads a"
    " bounded part of the index). Each is a summary: its steps and child runs are at"
    " ``/v1/pipelines/{pipeline_id}``.",
)
def list_pipelines(
    services: Svc,
    who: Who,
    pipeline: Annotated[
        str | None, Query(max_length=200, description="Only runs of this pipeline (the name started).")
    ] = None,
    status: PIPELINE_STATUSES | None = None,
    since: Annotated[
        float | None,
        Query(ge=0, le=MAX_UNIX_S, description="Only pipeline runs created at or after (Unix seconds)."),
    ] = None,
    cursor: Annotated[str | None, Query(max_length=300, pattern=CURSOR_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> PipelineList:
    try:
        page = services.client.list_pipelines(
            tenant=who.tenant, name=pipeline, status=status, since=since, cursor=cursor, limit=limit
        )
    except InvalidRequest as exc:
        raise ApiError(422, "invalid_request", exc.message) from None
    return PipelineList(pipelines=[summary_of(m) for m in page.pipelines], next_cursor=page.next_cursor)


@router.get("/pipelines/{pipeline_id}", response_model=PipelineStatus, summary="A pipeline run, step by step")
def get_pipeline(pipeline_id: str, services: Svc, who: Who) -> PipelineStatus:
    return _owned(services, who, pipeline_id).status()


@router.post(
    "/pipelines/{pipeline_id}/cancel",
    status_code=202,
    response_model=PipelineStatus,
    summary="Cancel a pipeline run and its live child runs",
    description="409 if it has already ended.",
)
def cancel_pipeline(pipeline_id: str, services: Svc, who: Who) -> PipelineStatus:
    handle = _owned(services, who, pipeline_id)
    was = handle.cancel()
    if was != "ok":
        raise ApiError(
            409,
            "wrong_state",
            f"pipeline run {pipeline_id} has already ended ({was})",
            details={"status": was},
        )
    return handle.status()


@router.get(
    "/pipelines/{pipeline_id}/events",
    response_model=PipelineEvents,
    summary="A pipeline run's events",
    description="Each step's start, each child run's start and end (with its ``run_id``, whose own"
    " events are at ``/v1/runs/{run_id}/events``), branches taken, and its end.",
)
def pipeline_events(
    pipeline_id: str,
    services: Svc,
    who: Who,
    after: Annotated[str, Query(max_length=41)] = "0-0",
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
) -> PipelineEvents:
    cursor = event_cursor(after)
    handle = _owned(services, who, pipeline_id)
    page = handle.store.events(handle.pipeline_id, after=cursor, count=limit)
    return PipelineEvents(
        events=[{"id": event_id, **event} for event_id, event in page], last_id=page[-1][0] if page else None
    )
