"""``/v1/runs/search``, ``/v1/runs/{id}/fork`` and ``/v1/bulk``: finding a tenant's runs, forking
one, and acting on many as a durable bulk job.

Everything is the caller's tenant's: a search reads its indexes only, a fork's source must be its
run (404 otherwise, as for a run that does not exist), and a bulk job's keys name the tenant, so
another tenant's job id is simply not found.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from producer.api.errors import ApiError
from producer.api.models import RunList, RunView, run_view
from producer.api.namespaces import allowed_again, allowed_models, model_refusal
from producer.api.runs import ERRORS, Svc, Who, owned_run
from producer.client import BulkJobNotFound, NoLiveWorker, UnknownAgent
from shared.bulk import DEFAULT_RATE_PER_S, MAX_RATE_PER_S, MIN_RATE_PER_S, BulkAction, BulkJob, BulkOutcome
from shared.errors import InvalidRequest
from shared.search import SearchQuery, UndeclaredSearchKey
from shared.store import CURSOR_PATTERN
from shared.tenants import ModelNotAllowed
from shared.timetravel import checkpoint_of, last_good_checkpoint

__all__ = [
    "BulkBody",
    "BulkJobList",
    "BulkOutcomeList",
    "ForkBody",
    "MAX_OUTCOMES_LISTED",
    "SearchBody",
    "bulk_runs",
    "cancel_bulk",
    "fork",
    "get_bulk",
    "list_bulk",
    "router",
    "search",
    "start_bulk",
]

router = APIRouter(prefix="/v1", responses=ERRORS)

#: Outcomes one answer lists (the counters of the job count them all).
MAX_OUTCOMES_LISTED = 1000

_JobId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[0-9a-f]{1,64}$")]


class SearchBody(BaseModel):
    """``POST /v1/runs/search``: the filters (all apply) and the page."""

    model_config = ConfigDict(extra="forbid")

    query: SearchQuery = Field(default_factory=SearchQuery)
    cursor: str | None = Field(default=None, max_length=300, pattern=CURSOR_PATTERN)
    limit: int = Field(default=50, ge=1, le=200)


class ForkBody(BaseModel):
    """``POST /v1/runs/{id}/fork``: from which checkpoint, with which input."""

    model_config = ConfigDict(extra="forbid")

    version: int | None = Field(
        default=None,
        ge=1,
        description="The checkpoint to fork from; default: the last one before the run ended (its"
        " newest for a run still going).",
    )
    input: str | None = Field(
        default=None,
        min_length=1,
        description="Replaces the last user message of the conversation as it was at that checkpoint.",
    )


class BulkBody(BaseModel):
    """``POST /v1/bulk``: an action on every run of a search."""

    model_config = ConfigDict(extra="forbid")

    action: BulkAction = Field(
        description="retry: a fresh run with the same request, for each ended run; fork: a new run"
        " from the last checkpoint before the run ended; cancel: each run not ended yet."
    )
    query: SearchQuery = Field(default_factory=SearchQuery)
    rate_per_s: float = Field(
        default=DEFAULT_RATE_PER_S,
        ge=MIN_RATE_PER_S,
        le=MAX_RATE_PER_S,
        description="Runs acted on per second.",
    )


class BulkJobList(BaseModel):
    jobs: list[BulkJob]


class BulkOutcomeList(BaseModel):
    """What a job did to the runs it got to, by run id (at most 1000 listed)."""

    outcomes: list[BulkOutcome]


def _invalid(exc: InvalidRequest) -> ApiError:
    if isinstance(exc, UndeclaredSearchKey):
        details = {"undeclared": exc.keys, "declared": exc.declared}
        return ApiError(422, "invalid_request", exc.message, details=details)
    return ApiError(422, "invalid_request", exc.message)


@router.post(
    "/runs/search",
    response_model=RunList,
    summary="Search runs, newest first",
    description="Filters combine: agent, agent version, status, error kind, thread, creation time"
    " range and metadata keys the operator declared searchable (``WESICHAIN_SEARCH_ATTRIBUTES``; any"
    " other key is a 422 naming it). Live and archived runs page together through ``next_cursor``;"
    " a page may hold fewer than ``limit`` runs and still have one.",
)
def search(body: SearchBody, services: Svc, who: Who) -> RunList:
    try:
        page = services.client.search(body.query, tenant=who.tenant, cursor=body.cursor, limit=body.limit)
    except InvalidRequest as exc:
        raise _invalid(exc) from None
    return RunList(runs=[run_view(h) for h in page.runs], next_cursor=page.next_cursor)


@router.post(
    "/runs/{run_id}/fork",
    status_code=202,
    response_model=RunView,
    summary="Start a new run from a checkpoint of a run",
    description="The new run thinks again from the conversation as it was at ``version`` (default:"
    " the last checkpoint before the run ended); the original is untouched. 422 for a version the run"
    " does not have; 403 ``model_not_allowed`` if its model (or its assistant version's) is not one"
    " the tenant is allowed now, 403 ``forbidden`` if its namespace is not.",
)
def fork(run_id: str, services: Svc, who: Who, body: ForkBody | None = None) -> RunView:
    source = owned_run(services, who, run_id)
    wanted = body or ForkBody()
    heads = services.store.checkpoints(run_id)
    at = checkpoint_of(heads, wanted.version) if wanted.version is not None else last_good_checkpoint(heads)
    if at is None:
        versions = f"1..{heads[-1].version}" if heads else "none"
        raise ApiError(
            422,
            "invalid_request",
            f"run {run_id} has no checkpoint v{wanted.version} (versions: {versions})",
            details={"versions": versions},
        )
    allowed_again(services.gate, who, source, callback=False)
    if source.tenant is not None:
        reservation = services.gate.reserve(source.tenant)
    else:
        reservation = None
    try:
        handle = services.client.fork(
            run_id, at.version, input=wanted.input, allowed_models=allowed_models(services.gate, who)
        )
    except ModelNotAllowed as exc:
        raise model_refusal(exc) from None
    except UnknownAgent as exc:
        raise ApiError(422, "unknown_agent", exc.message, details={"agent": source.agent}) from None
    except NoLiveWorker as exc:
        raise ApiError(503, "no_live_worker", str(exc), headers={"Retry-After": "1"}) from None
    except InvalidRequest as exc:
        raise ApiError(422, "invalid_request", exc.message) from None
    finally:
        services.gate.release(reservation)
    return run_view(handle.status())


@router.post(
    "/bulk",
    status_code=202,
    response_model=BulkJob,
    summary="Start a bulk job on the runs of a search",
    description="Retries, forks or cancels every run the search finds among those created before"
    " the job, as a durable job the workers run at ``rate_per_s``: it survives the loss of any worker"
    " and acts on each run once. Follow it with ``GET /v1/bulk/{job_id}``.",
)
def start_bulk(body: BulkBody, services: Svc, who: Who) -> BulkJob:
    try:
        return services.client.bulk(body.action, body.query, tenant=who.tenant, rate_per_s=body.rate_per_s)
    except InvalidRequest as exc:
        raise _invalid(exc) from None


@router.get("/bulk", response_model=BulkJobList, summary="The caller's bulk jobs, newest first")
def list_bulk(services: Svc, who: Who, limit: Annotated[int, Query(ge=1, le=200)] = 50) -> BulkJobList:
    return BulkJobList(jobs=services.client.bulk_jobs(tenant=who.tenant, limit=limit))


def _job(services: Svc, who: Who, job_id: str) -> BulkJob:
    try:
        return services.client.bulk_job(job_id, tenant=who.tenant)
    except BulkJobNotFound:
        raise ApiError(404, "not_found", f"no bulk job {job_id!r}") from None


@router.get("/bulk/{job_id}", response_model=BulkJob, summary="A bulk job and how far it got")
def get_bulk(job_id: _JobId, services: Svc, who: Who) -> BulkJob:
    return _job(services, who, job_id)


@router.get(
    "/bulk/{job_id}/runs",
    response_model=BulkOutcomeList,
    summary="What a bulk job did to each run",
    description="The runs it got to, in run id order (the first 1000): acted on (with the run a retry"
    " or fork created), skipped (and why) or failed (and why).",
)
def bulk_runs(job_id: _JobId, services: Svc, who: Who) -> BulkOutcomeList:
    _job(services, who, job_id)
    outcomes = services.client.bulk_outcomes(job_id, tenant=who.tenant)
    listed = [outcomes[run_id] for run_id in sorted(outcomes)[:MAX_OUTCOMES_LISTED]]
    return BulkOutcomeList(outcomes=listed)


@router.post(
    "/bulk/{job_id}/cancel",
    status_code=202,
    response_model=BulkJob,
    summary="Stop a bulk job",
    description="It acts on no further run; the runs it made go on. 409 if it has ended already.",
)
def cancel_bulk(job_id: _JobId, services: Svc, who: Who) -> BulkJob:
    job = _job(services, who, job_id)
    if job.status != "running":
        raise ApiError(
            409, "wrong_state", f"bulk job {job_id} has ended ({job.status})", details={"status": job.status}
        )
    return services.client.cancel_bulk(job_id, tenant=who.tenant)
