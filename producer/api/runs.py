"""``/v1/runs``: submit, read, list, cancel and decide on a tenant's runs.

Every handler answers 404 for a run of another tenant, exactly as for a run that does not exist:
a tenant cannot even learn that another tenant's run id is taken.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import redis
from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from producer.admission import Reservation
from producer.api.auth import Caller, bearer_credentials, caller, caller_with
from producer.api.body_limit import replaying
from producer.api.errors import ApiError, ErrorBody, answer_to
from producer.api.models import (
    CheckpointList,
    DecisionBody,
    DenyBody,
    RunChildren,
    RunList,
    RunView,
    SubmitBody,
    run_view,
)
from producer.api.namespaces import (
    AllowList,
    CachedAllowList,
    allowed_again,
    allowed_callback,
    allowed_model,
    allowed_models,
    allowed_namespace,
    model_refusal,
)
from producer.api.services import Services
from producer.client import (
    NoLiveWorker,
    RequestConflict,
    RunHandle,
    RunRequest,
    UnknownAgent,
    idempotent_run_id,
)
from shared.errors import ConfigError, InvalidRequest, ThreadBusy
from shared.request import check_run_id as check_any_run_id
from shared.request import validate_request
from shared.state import Callback, CallbackState, Decision, Phase, RunHead, RunStatus
from shared.store import CURSOR_PATTERN
from shared.store.runs import creation_of
from shared.tenants import ModelNotAllowed, TenantSettings
from shared.versions import waiting_for
from shared.webhooks import check_url
from shared.workers import LiveWorker

#: The latest time a listing filter may name (Unix seconds, the year 2286): bounds the arithmetic.
MAX_UNIX_S = 10_000_000_000

__all__ = [
    "ERRORS",
    "MAX_UNIX_S",
    "Svc",
    "SubmitShortcut",
    "Who",
    "approve",
    "cancel",
    "check_run_id",
    "checkpoints",
    "children",
    "deny",
    "get_run",
    "json_answer",
    "list_runs",
    "owned",
    "owned_run",
    "retry",
    "router",
    "services_of",
    "submit",
    "submitted",
]

#: The error answers every route documents (one shape: :class:`ErrorBody`).
ERRORS: dict[int | str, dict[str, object]] = {
    "4XX": {"model": ErrorBody, "description": "The request cannot be served as sent."},
    "5XX": {"model": ErrorBody, "description": "The service cannot serve it now."},
}

router = APIRouter(prefix="/v1", responses=ERRORS)


async def services_of(request: Request) -> Services:
    # A coroutine: FastAPI runs a plain-function dependency on a worker thread, a hop per request.
    services: Services = request.app.state.services
    return services


Svc = Annotated[Services, Depends(services_of)]
Who = Annotated[Caller, Depends(caller)]


def owned_run(services: Services, who: Caller, run_id: str) -> RunHead:
    """The caller's run ``run_id``; 404 if there is none (or it is another tenant's)."""
    check_run_id(run_id)
    return owned(who, run_id, services.store.load(run_id))


def check_run_id(run_id: str) -> None:
    """404 for a run id no run can have."""
    try:
        check_any_run_id(run_id)
    except InvalidRequest:
        raise ApiError(404, "not_found", f"no run {run_id[:80]!r}") from None


def owned(who: Caller, run_id: str, head: RunHead | None) -> RunHead:
    """``head`` (run ``run_id`` as read) if it is the caller's; 404 if there is none, or it is
    another tenant's: the same answer, so a tenant cannot learn another's run ids."""
    if head is None or head.tenant != who.tenant:
        raise ApiError(404, "not_found", f"no run {run_id!r}")
    return head


def _view(services: Services, head: RunHead, live: list[LiveWorker] | None = None) -> RunView:
    """The run as answered; ``live``: the workers to say why it waits from (default: read now)."""
    raw = services.store.callback_state(head.run_id) if head.callback is not None else None
    callback = CallbackState.model_validate_json(raw) if raw is not None else None
    decided = head.phase is Phase.AWAITING_APPROVAL and services.store.load_decision(head.run_id) is not None
    previous = _thread_previous(services, [head]).get(head.run_id)
    reason = _waiting_for(services, [head], decided, {head.run_id: previous} if previous else {}, live)
    return run_view(head, callback, reason.get(head.run_id), previous)


def _thread_previous(services: Services, heads: list[RunHead]) -> dict[str, str]:
    """The run each of these, parked for its thread, waits for (one read per queued thread run)."""
    found = {}
    for head in heads:
        if head.thread_id is not None and head.phase is Phase.IDLE:
            wait = services.store.thread_wait(head.run_id)
            if wait is not None:
                found[head.run_id] = str(wait["waiting_for"])
    return found


def _waiting_for(
    services: Services,
    heads: list[RunHead],
    decided: bool = False,
    previous: dict[str, str] | None = None,
    live: list[LiveWorker] | None = None,
) -> dict[str, str]:
    """Why each of these runs is not moving, if something can be said (one read of the workers).
    ``decided``: the one parked run given has a decision stored, its resumption waits for a worker;
    ``previous``: the runs parked for their thread, and the run each waits for."""
    moving = [h for h in heads if not h.terminal and (decided or h.phase is not Phase.AWAITING_APPROVAL)]
    if not moving:
        return {}
    if live is None:
        live = services.client.workers.live()
    previous = previous or {}
    return {
        h.run_id: reason
        for h in moving
        if (reason := waiting_for(h, live, decided, previous.get(h.run_id))) is not None
    }


@router.post(
    "/runs",
    status_code=202,
    response_model=RunView,
    summary="Start a run",
    description="Creates the run (queued) and hands it to the workers. With an ``Idempotency-Key``,"
    " the same request sent again returns the same run instead of starting another; the same key"
    " with a different request is a 409, and so is a ``thread_policy`` of ``reject`` while another"
    " run of the thread has not ended (kind ``thread_busy``, naming that run in ``details.run_id``)."
    " A ``namespace`` the caller's tenant is not allowed is a 403 ``forbidden``; a ``model`` it is not"
    " allowed, or an assistant whose version names one, a 403 ``model_not_allowed`` (``details.model``,"
    " ``details.allowed``)."
    " An agent no live worker serves is a 422 ``unknown_agent``; while no live worker is known at all"
    " (workers registering again after a Redis restart) it is a 503 ``no_live_worker`` with"
    " Retry-After: send the same request again."
    " With ``Accept: text/event-stream`` the answer is the run's event stream from its first event,"
    " as ``GET /v1/runs/{run_id}/events`` would send it (``Location`` names the run): submitting and"
    " following a run in one request. The stream's place among the tenant's streams is taken"
    " before the run is created, so a 429 ``too_many_streams`` starts nothing.",
    responses={
        200: {
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "description": "With Accept: text/event-stream: the new run's events, live until its end event.",
        }
    },
)
async def submit(
    body: SubmitBody,
    request: Request,
    services: Svc,
    who: Who,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=255)] = None,
) -> Response:
    return await submitted(body, services, who, idempotency_key, request.headers.get("accept", ""))


async def submitted(
    body: SubmitBody, services: Services, who: Caller, idempotency_key: str | None, accept: str
) -> Response:
    """The answer to a submit: the run as created (202), or its event stream when ``accept`` asks
    for one. The route's, and :class:`SubmitShortcut`'s."""
    # The event stream's answer is events.py's, which builds on this module's reads.
    from producer.api.events import submitted_answer, wants_stream

    slot = services.streams.take(who.tenant) if wants_stream(accept) else None
    try:
        on_loop = _on_loop(services, who, body, idempotency_key)
        if on_loop is None:
            view = await run_in_threadpool(_submit_in_thread, body, services, who, idempotency_key)
        else:
            view = await _submit_on_loop(body, services, who, *on_loop)
        if slot is None:
            return json_answer(view, 202)
        # A run found ended (the same request sent again) is answered its events all the same.
        ended = Phase(view.phase).terminal
        location = {"Location": f"/v1/runs/{view.run_id}"}
        return await submitted_answer(services, view.run_id, ended, slot, location)
    except BaseException:
        if slot is not None:
            slot.release()
        raise


class SubmitShortcut:
    """ASGI middleware: ``POST /v1/runs`` as clients send it, served without FastAPI's routing,
    middleware and dependency solving, which took a fifth of a submit's CPU in the API process
    (docs/performance.md, "The ninth round").

    It serves only a request it answers exactly as the route would: a body declared
    ``application/json`` that the route's model takes, credentials (if any) of the ``Bearer``
    scheme, no ``Idempotency-Key``, no root path. Any other request is handed to the app, its body
    with it, so that every refusal of a malformed request comes from one place, the route. What
    the submit raises is answered by the app's own exception handlers (``errors.answer_to``), and
    the submit itself is the route's (:func:`submitted`). ``create_app`` adds it inside the body
    limit and the loopback guard, which it relies on: it reads the body those let through whole."""

    def __init__(self, app: ASGIApp, api: FastAPI) -> None:
        self.app = app
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        plain = _plain_submit(scope) if scope["type"] == "http" else None
        services: Services | None = getattr(self.api.state, "services", None)
        if plain is None or services is None:
            await self.app(scope, receive, send)
            return
        authorization, accept = plain
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        replay = replaying(raw, receive)
        try:
            body = SubmitBody.model_validate(json.loads(raw))
        except ValueError:  # not JSON, or not a submit's body (ValidationError): the route says why
            await self.app(scope, replay, send)
            return
        try:
            who = await caller_with(services, bearer_credentials(authorization))
            answer = await submitted(body, services, who, None, accept)
        except Exception as exc:
            answer = await answer_to(self.api, scope, exc)
        await answer(scope, replay, send)


#: The content types :class:`SubmitShortcut` reads a body as JSON by (the route takes more: any
#: ``application/*+json``, with any parameter, which the route is left to read).
_JSON = (b"application/json", b"application/json; charset=utf-8")


def _plain_submit(scope: Scope) -> tuple[str | None, str] | None:
    """A submit :class:`SubmitShortcut` serves: its ``Authorization`` and ``Accept`` headers. None:
    any other request, for the app."""
    if scope["method"] != "POST" or scope["path"] != "/v1/runs" or scope.get("root_path"):
        return None
    authorization: str | None = None
    accept: str | None = None
    json_body = False
    for name, value in scope["headers"]:
        if name == b"content-type":
            if json_body or value.lower() not in _JSON:
                return None
            json_body = True
        elif name == b"authorization":
            if authorization is not None:
                return None
            authorization = value.decode("latin-1")
        elif name == b"accept" and accept is None:  # the first, as the route reads it
            accept = value.decode("latin-1")
        elif name == b"idempotency-key":
            return None
    return (authorization, accept or "") if json_body else None


def _on_loop(
    services: Services, who: Caller, body: SubmitBody, idempotency_key: str | None
) -> tuple[TenantSettings | None, list[LiveWorker]] | None:
    """What a submit served on the event loop goes by, when it can be: the common one, whose every
    read but its two scripts is answered from this process's caches. None: a worker thread serves
    it (:func:`_submit_in_thread`), with the sync client's reads: an idempotency key (its replay
    and the archive), a thread (its admission), an assistant (its pin), a webhook (its host's
    resolution), a cache to read again (the tenant's settings, the worker registry, Redis's
    memory), Redis Cluster (the reservation's counts and drop are round trips of their own), or a
    broker the create script cannot push to (RabbitMQ)."""
    if not services.submits_on_loop:
        return None
    services.refresh_ahead(who.tenant)
    if idempotency_key is not None or body.thread_id is not None or body.assistant is not None:
        return None
    tenant = services.gate.cached(who.tenant) if who.tenant is not None else None
    live = services.cached_workers()
    client = services.client
    if (who.tenant is not None and tenant is None) or live is None:
        return None
    url = body.callback.url if body.callback is not None else tenant.default_callback if tenant else None
    if url is not None and not services.config.settings.webhook_allow_private:
        return None  # its host is resolved (and checked public) before the run is accepted
    if not client.serves_cached(body.agent) or not client.memory_guard.fresh():
        return None
    return tenant, live


async def _submit_on_loop(
    body: SubmitBody, services: Services, who: Caller, tenant: TenantSettings | None, live: list[LiveWorker]
) -> RunView:
    """A submit on the event loop: the same decisions as the sync client's (``Client.plan_run``,
    ``run_to_create``, ``creation_outcome``), the run admitted under its tenant's limits and
    created by one script (``Admissions.create_on_loop``) sent on the event loop's kept connections
    (``shared.scripts.LoopConnections``): one round trip after the key's read, no worker thread."""
    allowed: AllowList = CachedAllowList(tenant) if tenant is not None else services.gate
    default = tenant.default_callback if tenant is not None else None
    namespace, callback = _checked(services, who, body, allowed, default)
    client, gate, loop = services.client, services.gate, services.loop_connections
    if loop is None:
        raise ConfigError("a submit on the event loop needs the connections of a single Redis")
    try:
        new = _run_request(body, who, namespace, callback)
        head, start, _ = client.plan_run(new, True, None, allowed_models(allowed, who))
        client.memory_guard.check()
        keys, args = services.store.create_call(client.run_to_create(head, start, None))
        try:
            if who.tenant is not None and tenant is not None:
                # Admitted under the tenant's limits in the step that creates the run.
                raw = await gate.create_on_loop(who.tenant, tenant.limits, keys, args)
            else:
                raw = await loop.run(services.store.script("create"), keys, args)
        except redis.exceptions.OutOfMemoryError:
            raise await run_in_threadpool(client.store_full) from None  # reads how full Redis is
        outcome = client.creation_outcome(creation_of(raw))
        if outcome == "exists":
            raise InvalidRequest(f"run id {head.run_id!r} already exists")
        if outcome != "pushed":
            await run_in_threadpool(client.send_starts, [start])
    except _REFUSED as exc:
        raise _refusal(exc, body.agent) from None
    return _created_view(head, live)


def _created_view(head: RunHead, live: list[LiveWorker]) -> RunView:
    """:func:`_view` of a run this request has just created outside any thread, without a read: it
    has no callback state yet (written once it ends), nor a decision, nor a run it waits for."""
    return run_view(head, waiting_for=waiting_for(head, live, False, None))


def _checked(
    services: Services, who: Caller, body: SubmitBody, allowed: AllowList, default_callback: str | None
) -> tuple[str | None, Callback | None]:
    """A submit's request checked before its reservation (so that a refusal spends none of the
    tenant's submits): its fields, the namespace, model and callback the caller may name; the
    namespace, and the callback the run gets (its tenant's default webhook if it names none)."""
    fields = body.model_dump(exclude_none=True)
    try:
        validate_request(
            {**fields, "tenant": who.tenant} if who.tenant else fields, services.config.settings.limits
        )
    except InvalidRequest as exc:
        raise ApiError(422, "invalid_request", exc.message) from None
    namespace = allowed_namespace(allowed, who, body.namespace)
    # The model of the assistant version the run is pinned to is checked by the client, which
    # pins it (allowed_models).
    allowed_model(allowed, who, body.model)
    callback = body.callback
    if callback is None and default_callback:
        callback = Callback(url=default_callback)
    if callback is not None and callback.url is not None:
        _check_callback_url(services, callback.url)
    allowed_callback(allowed, who, callback)
    return namespace, callback


def _run_request(
    body: SubmitBody, who: Caller, namespace: str | None, callback: Callback | None
) -> RunRequest:
    return RunRequest(
        body.agent,
        body.input,
        thread_id=body.thread_id,
        metadata=body.metadata,
        model=body.model,
        tenant=who.tenant,
        callback=callback,
        state=body.state,
        namespace=namespace,
        thread_policy=body.thread_policy,
        assistant=body.assistant,
        assistant_version=body.assistant_version,
    )


def _submit_in_thread(
    body: SubmitBody, services: Services, who: Caller, idempotency_key: str | None
) -> RunView:
    """A submit on a worker thread, with the sync client (see :func:`_on_loop` for when)."""
    default = services.gate.default_callback(who.tenant) if who.tenant is not None else None
    namespace, callback = _checked(services, who, body, services.gate, default)
    replay = idempotency_key is not None and bool(
        services.store.redis.exists(services.keys.run(idempotent_run_id(who.tenant, idempotency_key)))
    )
    if not replay:
        # Refused before the reservation, which counts in the tenant's submit window: an agent
        # no live worker serves is the caller's mistake, not a submit. (A replay is answered its
        # run, whichever agents are served now.)
        try:
            services.client.served(body.agent)
        except _REFUSED as exc:
            raise _refusal(exc, body.agent) from None
    with _starting(services, who, body.agent, replay) as start:
        handle = services.client.submit_request(
            _run_request(body, who, namespace, callback),
            idempotency_key=idempotency_key,
            allowed_models=allowed_models(services.gate, who),
            release=start.with_create,
        )
        head = start.created(handle)
    return _view(services, head, services.recent_workers())


def json_answer(view: BaseModel, status_code: int = 200) -> Response:
    """``view`` as the route's JSON answer, rendered once: handed the model itself, FastAPI would
    validate it against the route's ``response_model`` again before rendering it, for a model this
    process has just built and validated. The route keeps its ``response_model`` for the schema."""
    return Response(view.model_dump_json().encode(), status_code=status_code, media_type="application/json")


def _check_callback_url(services: Services, url: str) -> None:
    try:
        check_url(url, allow_private=services.config.settings.webhook_allow_private)
    except InvalidRequest as exc:
        raise ApiError(422, "invalid_request", f"callback: {exc.message}") from None


class _Start:
    """A run being started: its reservation under the tenant's limits, held until it is created."""

    def __init__(self, services: Services, reservation: Reservation | None) -> None:
        self.services = services
        self.reservation = reservation
        self.released = False
        #: The reservation for the create script to drop as it creates the run (standalone Redis).
        self.with_create = services.gate.released_with_create(reservation)

    def created(self, handle: RunHandle) -> RunHead:
        """The run is started: its head for the answer, the reservation dropped. A run this submit
        created is answered as created, its reservation dropped by the create script itself (on
        Redis Cluster, here); a run the submit found (an idempotent resubmit) is read, in the
        round trip that drops the reservation."""
        if handle.created is not None:
            if self.with_create is None:
                self.release()
            self.released = True
            return handle.created
        self.released = True
        head = self.services.gate.release_and_load(self.reservation, handle.run_id)
        return head if head is not None else handle.status()

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.services.gate.release(self.reservation)


@contextmanager
def _starting(services: Services, who: Caller, agent: str, replay: bool) -> Iterator[_Start]:
    """Starting a run for the caller: counted against its tenant's limits while it is created (a
    replayed request starts nothing and is answered whatever the limits), and the client's refusals
    as the API's errors."""
    reservation = None
    if who.tenant is not None and not replay:
        reservation = services.gate.reserve(who.tenant)
    start = _Start(services, reservation)
    try:
        yield start
    except _REFUSED as exc:
        raise _refusal(exc, agent) from None
    finally:
        # Only now: the run is in the in-flight counts (or was not created), see producer/api/limits.py.
        start.release()


#: What starting a run may refuse it for: :func:`_refusal` answers each (a full Redis's
#: ``StoreFull`` is answered by its handler, errors.py).
_REFUSED = (ThreadBusy, NoLiveWorker, InvalidRequest, RequestConflict)


def _refusal(exc: Exception, agent: str) -> ApiError:
    """The API's answer to the client's refusal of a run (one of :data:`_REFUSED`)."""
    if isinstance(exc, ThreadBusy):
        # The caller's own thread (thread ids are per tenant): the busy run is its own to name.
        details = {"thread_id": exc.thread_id, "run_id": exc.run_id, "retryable": True}
        return ApiError(409, "thread_busy", exc.message, details=details)
    if isinstance(exc, UnknownAgent):
        return ApiError(422, "unknown_agent", exc.message, details={"agent": agent})
    if isinstance(exc, NoLiveWorker):
        # Transient (workers registering again after a Redis restart): the client retries, unlike
        # for a 422, which says the same request will never be accepted.
        retry_s = str(max(1, math.ceil(exc.retry_after_s)))
        return ApiError(
            503, "no_live_worker", str(exc), details={"agent": agent}, headers={"Retry-After": retry_s}
        )
    if isinstance(exc, RequestConflict):
        return ApiError(409, "conflict", str(exc))
    if isinstance(exc, ModelNotAllowed):
        return model_refusal(exc)
    if isinstance(exc, InvalidRequest):
        return ApiError(422, "invalid_request", exc.message)
    raise exc


@router.get("/runs/{run_id}", response_model=RunView, summary="A run's current state")
def get_run(run_id: str, services: Svc, who: Who) -> Response:
    return json_answer(_view(services, owned_run(services, who, run_id)))


@router.get(
    "/runs",
    response_model=RunList,
    summary="List runs, newest first",
    description="Filters combine; pages follow ``next_cursor``. A page may hold fewer than ``limit``"
    " runs and still have a ``next_cursor`` (each page reads a bounded part of the index).",
)
def list_runs(
    services: Svc,
    who: Who,
    agent: Annotated[str | None, Query(max_length=200)] = None,
    status: RunStatus | None = None,
    thread_id: Annotated[str | None, Query(max_length=200)] = None,
    since: Annotated[
        float | None,
        Query(ge=0, le=MAX_UNIX_S, description="Only runs created at or after (Unix seconds)."),
    ] = None,
    cursor: Annotated[str | None, Query(max_length=300, pattern=CURSOR_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> RunList:
    try:
        page = services.client.list_runs(
            tenant=who.tenant,
            agent=agent,
            status=status,
            thread_id=thread_id,
            since=since,
            cursor=cursor,
            limit=limit,
        )
    except InvalidRequest as exc:
        raise ApiError(422, "invalid_request", exc.message) from None
    previous = _thread_previous(services, page.runs)
    waiting = _waiting_for(services, page.runs, previous=previous)
    return RunList(
        runs=[
            run_view(h, waiting_for=waiting.get(h.run_id), waiting_for_run=previous.get(h.run_id))
            for h in page.runs
        ],
        next_cursor=page.next_cursor,
    )


@router.get(
    "/runs/{run_id}/checkpoints",
    response_model=CheckpointList,
    summary="A run's committed states, in version order",
    description="Versions after ``after_version``, at most ``limit`` of them; pages follow"
    " ``next_after_version``.",
)
def checkpoints(
    run_id: str,
    services: Svc,
    who: Who,
    after_version: Annotated[int, Query(ge=0, le=2**31)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 1000,
) -> CheckpointList:
    owned_run(services, who, run_id)
    heads = services.store.checkpoints(run_id, after_version, after_version + limit - 1)
    return CheckpointList(
        checkpoints=[run_view(h) for h in heads],
        next_after_version=after_version + limit if len(heads) == limit else None,
    )


@router.post(
    "/runs/{run_id}/cancel",
    status_code=202,
    response_model=RunView,
    summary="Ask a run to stop",
    description="The run ends interrupted at its next phase boundary. 409 if it has already ended.",
)
def cancel(run_id: str, services: Svc, who: Who) -> RunView:
    head = owned_run(services, who, run_id)
    if head.terminal:
        raise ApiError(
            409,
            "wrong_state",
            f"run {run_id} has already ended ({head.status})",
            details={"status": head.status},
        )
    RunHandle(services.client, run_id).cancel()
    return _view(services, services.store.load(run_id) or head)


def _decide(services: Services, who: Caller, run_id: str, decision: Decision) -> RunView:
    head = owned_run(services, who, run_id)
    if head.status != "awaiting_approval":
        raise ApiError(
            409,
            "wrong_state",
            f"run {run_id} is {head.status}, not awaiting approval",
            details={"status": head.status},
        )
    try:
        RunHandle(services.client, run_id).decide(decision)
    except ValueError as exc:
        raise ApiError(409, "wrong_state", str(exc)) from None
    return _view(services, services.store.load(run_id) or head)


@router.post(
    "/runs/{run_id}/approve",
    status_code=202,
    response_model=RunView,
    summary="Approve what a parked run waits on",
    description="409 unless the run is awaiting approval.",
)
def approve(run_id: str, services: Svc, who: Who, body: DecisionBody | None = None) -> RunView:
    by = _decider(who)
    decision = (
        Decision(approve=True, note=body.note, always=body.always, by=by)
        if body
        else Decision(approve=True, by=by)
    )
    return _decide(services, who, run_id, decision)


@router.post(
    "/runs/{run_id}/deny",
    status_code=202,
    response_model=RunView,
    summary="Deny what a parked run waits on (the model is told)",
    description="409 unless the run is awaiting approval.",
)
def deny(run_id: str, services: Svc, who: Who, body: DenyBody | None = None) -> RunView:
    decision = Decision(approve=False, note=body.note if body else "", by=_decider(who))
    return _decide(services, who, run_id, decision)


def _decider(who: Caller) -> str:
    """Who decided, as the run's events keep it: the API key's tenant and id."""
    if who.key_id is None:
        return "api (no auth)"
    return f"tenant {who.tenant} key {who.key_id}"


@router.post(
    "/runs/{run_id}/retry",
    status_code=202,
    response_model=RunView,
    summary="Start a fresh run with an ended run's request",
    description="The same agent, input, thread, metadata, callback, namespace, thread policy and"
    " assistant version, and the model override and starting state the run was created with; the"
    " original is untouched and nothing of its conversation is kept (to go on from a checkpoint,"
    " fork it). 409 ``wrong_state`` while the run has not ended, or for a run the runtime started"
    " (a subagent, pipeline or eval run: retry its parent, pipeline or eval). With an"
    " ``Idempotency-Key``, the same retry sent again returns the same new run. Counted against the"
    " tenant's limits as a submit is. Its model (and its assistant version's), namespace and Celery"
    " callback are checked against what the tenant is allowed now: a model taken back since the run"
    " was created is a 403 ``model_not_allowed``, a namespace or callback a 403 ``forbidden``.",
)
def retry(
    run_id: str,
    services: Svc,
    who: Who,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=255)] = None,
) -> RunView:
    head = owned_run(services, who, run_id)
    if not head.terminal:
        raise ApiError(
            409, "wrong_state", f"run {run_id} has not ended ({head.status})", details={"status": head.status}
        )
    if head.parent is not None or head.link is not None:
        raise ApiError(
            409,
            "wrong_state",
            f"run {run_id} was started by the runtime (a subagent, pipeline or eval run)",
            details={"status": head.status},
        )
    allowed_again(services.gate, who, head, callback=True)
    replay = idempotency_key is not None and bool(
        services.store.redis.exists(services.keys.run(idempotent_run_id(who.tenant, idempotency_key)))
    )
    with _starting(services, who, head.agent, replay):
        handle = services.client.retry(
            head, idempotency_key=idempotency_key, allowed_models=allowed_models(services.gate, who)
        )
    return _view(services, handle.status())


@router.get(
    "/runs/{run_id}/children",
    response_model=RunChildren,
    summary="A run's subagent runs",
    description="The child runs its subagent calls started, in the order its steps started them"
    " (each names this run in ``parent``). A pipeline's child runs are at"
    " ``/v1/pipelines/{pipeline_id}``.",
)
def children(run_id: str, services: Svc, who: Who) -> RunChildren:
    owned_run(services, who, run_id)
    # Children are created under their parent's tenant; checked all the same.
    found = [c for c in services.client.children(run_id) if c.tenant == who.tenant]
    return RunChildren(runs=[run_view(c) for c in found])
