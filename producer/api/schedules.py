"""``/v1/schedules``: the caller's tenant's schedules, cron expressions and intervals that start
runs or pipeline runs (``shared/schedules.py``; ``wesichain scheduler`` fires them).

The tenant is the API key's, never a field of the request: a schedule's runs are the tenant's, and
another tenant's schedule answers 404 exactly as one that does not exist, for reading and for every
change alike.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from producer.api.errors import ApiError
from producer.api.namespaces import allowed_models, model_refusal
from producer.api.runs import ERRORS, Svc, Who
from producer.client import NoLiveWorker, UnknownAgent
from producer.pipelines import UnknownPipeline
from producer.schedules import ScheduleNotFound
from shared.errors import InvalidRequest
from shared.schedules import (
    HISTORY_MAX,
    MAX_CATCH_UP,
    MAX_FIRE_TIMES,
    MissedPolicy,
    OverlapPolicy,
    Schedule,
    ScheduleTick,
    Timing,
)
from shared.tenants import ModelNotAllowed

__all__ = [
    "FireTimes",
    "ScheduleBody",
    "ScheduleList",
    "ScheduleRuns",
    "ScheduleUpdate",
    "create_schedule",
    "delete_schedule",
    "get_schedule",
    "list_schedules",
    "next_fire_times",
    "pause_schedule",
    "resume_schedule",
    "router",
    "schedule_runs",
    "update_schedule",
]

router = APIRouter(prefix="/v1/schedules", responses=ERRORS, tags=["schedules"])

_ScheduleId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[0-9a-zA-Z]{1,64}$")]


class ScheduleBody(BaseModel):
    """``POST /v1/schedules``: what each run is asked, when, and what to do with missed and
    overlapping ticks."""

    model_config = ConfigDict(extra="forbid")

    agent: str | None = Field(default=None, description="The agent each run is of (or ``pipeline``).")
    pipeline: str | None = Field(
        default=None,
        description="Start a pipeline run of this pipeline at every tick instead (no metadata, thread"
        " or assistant then); its id is ``schedule-<schedule_id>-<tick>``.",
    )
    input: str = Field(description="The input of every run.")
    timing: Timing = Field(
        description='``{"cron": "*/5 * * * *", "timezone": "Europe/Paris"}`` or ``{"every_s": 60,'
        ' "anchor": UNIX_S}`` (the anchor defaults to now: the first tick is one interval on).'
    )
    metadata: dict[str, Any] | None = Field(default=None, description="Every run's metadata (bounded).")
    thread_id: str | None = Field(default=None, description="The runs' conversation thread.")
    assistant: str | None = Field(default=None, description="Run as this assistant of the tenant.")
    missed: MissedPolicy = Field(
        default="skip",
        description="Ticks that fell due while no scheduler could fire them: skip starts the newest"
        " one only, catch_up the newest ``catch_up`` ones, oldest first; the older are recorded as"
        " missed.",
    )
    catch_up: int = Field(default=1, ge=1, le=MAX_CATCH_UP)
    overlap: OverlapPolicy = Field(
        default="skip",
        description="While the previous scheduled run has not ended: skip (no run for the tick),"
        " enqueue (the run waits its turn in the schedule's thread), allow (runs side by side).",
    )
    check_agent: bool = Field(
        default=True, description="Refuse an agent no live worker serves now (or an unknown pipeline)."
    )
    until: int | None = Field(
        default=None, ge=0, le=2**40, description="An end date, Unix seconds: no tick after it fires."
    )


class ScheduleUpdate(BaseModel):
    """``PATCH /v1/schedules/{id}``: what changes (a field left out stays as it is)."""

    model_config = ConfigDict(extra="forbid")

    timing: Timing | None = Field(
        default=None, description="A new timing: the next tick is recomputed from now, atomically."
    )
    input: str | None = None
    metadata: dict[str, Any] | None = None
    missed: MissedPolicy | None = None
    catch_up: int | None = Field(default=None, ge=1, le=MAX_CATCH_UP)
    overlap: OverlapPolicy | None = None
    until: int | None = Field(
        default=None, ge=0, le=2**40, description="A new end date, Unix seconds; null removes it."
    )


class ScheduleList(BaseModel):
    schedules: list[Schedule]


class FireTimes(BaseModel):
    next_fire_times: list[int] = Field(description="Unix seconds; empty while paused.")


class ScheduleRuns(BaseModel):
    runs: list[ScheduleTick] = Field(description="Its newest ticks, newest first, each run's status now.")


def _not_found(schedule_id: str) -> ApiError:
    return ApiError(404, "not_found", f"no schedule {schedule_id[:80]!r}")


@router.post(
    "",
    status_code=201,
    response_model=Schedule,
    summary="Create a schedule",
    description="Starts a run of the agent at every tick, once per tick however many schedulers"
    " run. 422 for a bad timing or run request; 403 ``model_not_allowed`` for an ``assistant`` whose"
    " current version names a model the caller's tenant is not allowed (checked again at every tick:"
    " a tick whose model was taken back is recorded failed).",
)
def create_schedule(body: ScheduleBody, services: Svc, who: Who) -> Schedule:
    try:
        return services.client.schedules.create(
            body.agent,
            body.input,
            body.timing,
            tenant=who.tenant,
            metadata=body.metadata,
            thread_id=body.thread_id,
            assistant=body.assistant,
            missed=body.missed,
            catch_up=body.catch_up,
            overlap=body.overlap,
            check_agent=body.check_agent,
            pipeline=body.pipeline,
            until=body.until,
            allowed_models=allowed_models(services.gate, who),
        )
    except ModelNotAllowed as exc:
        raise model_refusal(exc) from None
    except UnknownAgent as exc:
        raise ApiError(
            422, "unknown_agent", exc.message, details={"agent": (body.agent or "")[:80]}
        ) from None
    except UnknownPipeline as exc:
        raise ApiError(
            422, "unknown_pipeline", exc.message, details={"pipeline": (body.pipeline or "")[:80]}
        ) from None
    except NoLiveWorker as exc:
        raise ApiError(503, "no_live_worker", str(exc), headers={"Retry-After": "1"}) from None
    except InvalidRequest as exc:
        raise ApiError(422, "invalid_request", exc.message) from None


@router.get("", response_model=ScheduleList, summary="The caller's schedules, oldest first")
def list_schedules(services: Svc, who: Who) -> ScheduleList:
    return ScheduleList(schedules=services.client.schedules.list(tenant=who.tenant))


@router.get("/{schedule_id}", response_model=Schedule, summary="A schedule")
def get_schedule(schedule_id: _ScheduleId, services: Svc, who: Who) -> Schedule:
    try:
        return services.client.schedules.get(schedule_id, tenant=who.tenant)
    except ScheduleNotFound:
        raise _not_found(schedule_id) from None


@router.patch(
    "/{schedule_id}",
    response_model=Schedule,
    summary="Change a schedule",
    description="Its timing, input, metadata, policies or end date (``until``; null removes it). A"
    " new timing or end date recomputes the next tick from now in the same atomic write; a tick"
    " being fired right now ends as it was decided. 422 for a bad change (nothing is written).",
)
def update_schedule(schedule_id: _ScheduleId, body: ScheduleUpdate, services: Svc, who: Who) -> Schedule:
    try:
        return services.client.schedules.update(
            schedule_id,
            tenant=who.tenant,
            timing=body.timing,
            input=body.input,
            metadata=body.metadata,
            missed=body.missed,
            catch_up=body.catch_up,
            overlap=body.overlap,
            until=body.until,
            clear_until="until" in body.model_fields_set and body.until is None,
        )
    except ScheduleNotFound:
        raise _not_found(schedule_id) from None
    except InvalidRequest as exc:
        raise ApiError(422, "invalid_request", exc.message) from None


@router.post("/{schedule_id}/pause", response_model=Schedule, summary="Stop firing a schedule")
def pause_schedule(schedule_id: _ScheduleId, services: Svc, who: Who) -> Schedule:
    try:
        return services.client.schedules.pause(schedule_id, tenant=who.tenant)
    except ScheduleNotFound:
        raise _not_found(schedule_id) from None


@router.post(
    "/{schedule_id}/resume",
    response_model=Schedule,
    summary="Fire a paused schedule again",
    description="From its next tick after now: ticks that passed while it was paused are not started.",
)
def resume_schedule(schedule_id: _ScheduleId, services: Svc, who: Who) -> Schedule:
    try:
        return services.client.schedules.resume(schedule_id, tenant=who.tenant)
    except ScheduleNotFound:
        raise _not_found(schedule_id) from None


@router.delete("/{schedule_id}", status_code=204, summary="Delete a schedule (the runs it started go on)")
def delete_schedule(schedule_id: _ScheduleId, services: Svc, who: Who) -> None:
    try:
        services.client.schedules.delete(schedule_id, tenant=who.tenant)
    except ScheduleNotFound:
        raise _not_found(schedule_id) from None


@router.get("/{schedule_id}/next", response_model=FireTimes, summary="A schedule's next fire times")
def next_fire_times(
    schedule_id: _ScheduleId,
    services: Svc,
    who: Who,
    n: Annotated[int, Query(ge=1, le=MAX_FIRE_TIMES)] = 5,
) -> FireTimes:
    try:
        return FireTimes(
            next_fire_times=services.client.schedules.next_fire_times(schedule_id, n, tenant=who.tenant)
        )
    except ScheduleNotFound:
        raise _not_found(schedule_id) from None


@router.get(
    "/{schedule_id}/runs",
    response_model=ScheduleRuns,
    summary="A schedule's last ticks and their runs",
    description="Started (with the run and its status), skipped, missed or failed, newest first.",
)
def schedule_runs(
    schedule_id: _ScheduleId,
    services: Svc,
    who: Who,
    limit: Annotated[int, Query(ge=1, le=HISTORY_MAX)] = 20,
) -> ScheduleRuns:
    try:
        return ScheduleRuns(runs=services.client.schedules.runs(schedule_id, limit, tenant=who.tenant))
    except ScheduleNotFound:
        raise _not_found(schedule_id) from None
