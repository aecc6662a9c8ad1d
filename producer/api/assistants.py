"""``/v1/assistants``: a tenant's assistants (``shared/assistants.py``): create, change, read,
list, compare, roll back and delete. Every route is scoped by the caller's tenant: another tenant's
assistant answers 404 exactly as a name never created. A version that names a model is one only
a tenant allowed that model may make (``producer/api/namespaces.py``), and a run pinned to it is
checked again when it is created."""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from producer.api.errors import ApiError
from producer.api.namespaces import allowed_model
from producer.api.runs import ERRORS, Svc, Who
from producer.client import NoLiveWorker, UnknownAgent
from shared.assistant_store import AssistantsFull
from shared.assistants import (
    AssistantConfig,
    AssistantConflict,
    AssistantExists,
    AssistantVersion,
    FieldChange,
    UnknownAssistant,
)
from shared.configurable import ASSISTANT_NAME_PATTERN
from shared.errors import InvalidRequest
from shared.request import MAX_NAME_CHARS, NAME_PATTERN

__all__ = [
    "MAX_VERSION",
    "Name",
    "assistant_versions",
    "create_assistant",
    "delete_assistant",
    "diff_assistant",
    "get_assistant",
    "list_assistants",
    "rollback_assistant",
    "update_assistant",
    "AssistantBody",
    "AssistantDiff",
    "AssistantList",
    "AssistantSummaryView",
    "AssistantUpdateBody",
    "AssistantVersionList",
    "RollbackBody",
    "router",
]

router = APIRouter(prefix="/v1", responses=ERRORS, tags=["assistants"])

#: The largest version number a request may name (far above any assistant's cap): a larger one is
#: a 422, not an index Redis refuses.
MAX_VERSION = 2**31

Name = Annotated[str, Path(min_length=1, max_length=100, pattern=ASSISTANT_NAME_PATTERN)]


class AssistantBody(BaseModel):
    """``POST /v1/assistants``: a new assistant, its configuration its version 1."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, pattern=ASSISTANT_NAME_PATTERN)
    agent: str = Field(
        min_length=1, max_length=MAX_NAME_CHARS, pattern=NAME_PATTERN, description="The agent it configures."
    )
    config: AssistantConfig = Field(default_factory=AssistantConfig)


class AssistantUpdateBody(BaseModel):
    """``PUT /v1/assistants/{name}``: the whole configuration of a new version."""

    model_config = ConfigDict(extra="forbid")

    config: AssistantConfig
    if_version: int | None = Field(
        default=None,
        ge=1,
        le=MAX_VERSION,
        description="Only if this is still the current version (else 409).",
    )


class RollbackBody(BaseModel):
    """``POST /v1/assistants/{name}/rollback``: the version whose configuration becomes current."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1, le=MAX_VERSION)
    if_version: int | None = Field(default=None, ge=1, le=MAX_VERSION)


class AssistantSummaryView(BaseModel):
    name: str
    agent: str
    version: int = Field(description="The current (newest) version.")
    updated_at: float


class AssistantList(BaseModel):
    assistants: list[AssistantSummaryView]
    next_after: str | None = Field(description="Pass as ``after`` for the next page; null: no more.")


class AssistantVersionList(BaseModel):
    versions: list[AssistantVersion] = Field(description="Newest first.")
    next_before: int | None = Field(description="Pass as ``before`` for the next page; null: no more.")


class AssistantDiff(BaseModel):
    name: str
    before: int
    after: int
    changes: list[FieldChange]


def _refused(exc: Exception) -> ApiError:
    """The API's answer for what the assistants' calls raise."""
    if isinstance(exc, UnknownAssistant):
        return ApiError(404, "not_found", exc.message)
    if isinstance(exc, AssistantExists | AssistantConflict):
        return ApiError(409, "conflict", exc.message)
    if isinstance(exc, UnknownAgent):
        return ApiError(422, "unknown_agent", exc.message)
    if isinstance(exc, NoLiveWorker):
        return ApiError(
            503,
            "no_live_worker",
            str(exc),
            headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))},
        )
    if isinstance(exc, AssistantsFull):
        return ApiError(409, "quota_exceeded", exc.message, details=exc.details)
    if isinstance(exc, InvalidRequest):
        field = exc.details.get("field")
        return ApiError(422, "invalid_request", exc.message, details={"field": field} if field else None)
    raise exc


_FAILS = (InvalidRequest, NoLiveWorker)


@router.post(
    "/assistants",
    status_code=201,
    response_model=AssistantVersion,
    summary="Create an assistant",
    description="Version 1 of a new assistant of the caller's tenant. The configuration is checked"
    " against what the live workers say its agent lets assistants configure: a field it does not is a"
    " 422 naming the field (``details.field``). A taken name is a 409. A ``model`` the caller's tenant"
    " is not allowed is a 403 ``model_not_allowed``. A version past the tenant's"
    " ``max_assistant_bytes`` is a 409 ``quota_exceeded``.",
)
def create_assistant(body: AssistantBody, services: Svc, who: Who) -> AssistantVersion:
    allowed_model(services.gate, who, body.config.model)
    try:
        return services.client.assistants.create(body.name, body.agent, body.config, tenant=who.tenant)
    except _FAILS as exc:
        raise _refused(exc) from None


@router.get("/assistants", response_model=AssistantList, summary="List the tenant's assistants")
def list_assistants(
    services: Svc,
    who: Who,
    after: Annotated[str | None, Query(min_length=1, max_length=100, pattern=ASSISTANT_NAME_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> AssistantList:
    found = services.client.assistants.list(tenant=who.tenant, after=after, limit=limit)
    return AssistantList(
        assistants=[
            AssistantSummaryView(name=a.name, agent=a.agent, version=a.version, updated_at=a.updated_at)
            for a in found
        ],
        next_after=found[-1].name if len(found) == limit else None,
    )


@router.get(
    "/assistants/{name}", response_model=AssistantVersion, summary="An assistant's current (or given) version"
)
def get_assistant(
    name: Name, services: Svc, who: Who, version: Annotated[int | None, Query(ge=1, le=MAX_VERSION)] = None
) -> AssistantVersion:
    try:
        return services.client.assistants.get(name, version=version, tenant=who.tenant)
    except _FAILS as exc:
        raise _refused(exc) from None


@router.put(
    "/assistants/{name}",
    response_model=AssistantVersion,
    summary="Change an assistant (a new version)",
    description="The body's configuration, as a whole, becomes a new version and the current one;"
    " runs created before keep the version they were pinned to. A ``model`` the caller's tenant is not"
    " allowed is a 403 ``model_not_allowed``. A version past the tenant's ``max_assistant_bytes`` is a"
    " 409 ``quota_exceeded``.",
)
def update_assistant(name: Name, body: AssistantUpdateBody, services: Svc, who: Who) -> AssistantVersion:
    allowed_model(services.gate, who, body.config.model)
    try:
        return services.client.assistants.update(
            name, body.config, tenant=who.tenant, if_version=body.if_version
        )
    except _FAILS as exc:
        raise _refused(exc) from None


@router.get(
    "/assistants/{name}/versions", response_model=AssistantVersionList, summary="An assistant's versions"
)
def assistant_versions(
    name: Name,
    services: Svc,
    who: Who,
    before: Annotated[int | None, Query(ge=1, le=MAX_VERSION)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> AssistantVersionList:
    try:
        found = services.client.assistants.versions(name, tenant=who.tenant, before=before, limit=limit)
    except _FAILS as exc:
        raise _refused(exc) from None
    more = bool(found) and found[-1].version > 1
    return AssistantVersionList(versions=found, next_before=found[-1].version if more else None)


@router.get(
    "/assistants/{name}/diff", response_model=AssistantDiff, summary="What changed between two versions"
)
def diff_assistant(
    name: Name,
    services: Svc,
    who: Who,
    before: Annotated[int, Query(ge=1, le=MAX_VERSION, alias="from")],
    after: Annotated[int, Query(ge=1, le=MAX_VERSION, alias="to")],
) -> AssistantDiff:
    try:
        changes = services.client.assistants.diff(name, before, after, tenant=who.tenant)
    except _FAILS as exc:
        raise _refused(exc) from None
    return AssistantDiff(name=name, before=before, after=after, changes=changes)


@router.post(
    "/assistants/{name}/rollback",
    status_code=201,
    response_model=AssistantVersion,
    summary="Roll an assistant back (a new version equal to an old one)",
    description="A 403 ``model_not_allowed`` if the old version names a model the caller's tenant is"
    " not allowed now; a 409 ``quota_exceeded`` past the tenant's ``max_assistant_bytes``.",
)
def rollback_assistant(name: Name, body: RollbackBody, services: Svc, who: Who) -> AssistantVersion:
    try:
        if who.tenant is not None:  # versions never change: the one checked is the one copied
            old = services.client.assistants.get(name, version=body.version, tenant=who.tenant)
            allowed_model(services.gate, who, old.config.model)
        return services.client.assistants.rollback(
            name, body.version, tenant=who.tenant, if_version=body.if_version
        )
    except _FAILS as exc:
        raise _refused(exc) from None


@router.delete(
    "/assistants/{name}",
    status_code=204,
    response_class=Response,
    summary="Delete an assistant",
    description="No new run, read or change names it any more (404), and it no longer counts against"
    " the tenant's 500 assistants. Runs already pinned to one of its versions go on with it: its"
    " versions are kept for the runs' retention. Creating the name again continues its version"
    " numbers, so that a version number never means two configurations.",
)
def delete_assistant(name: Name, services: Svc, who: Who) -> Response:
    try:
        services.client.assistants.delete(name, tenant=who.tenant)
    except _FAILS as exc:
        raise _refused(exc) from None
    return Response(status_code=204)
