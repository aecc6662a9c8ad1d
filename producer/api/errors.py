"""The API's one error shape, ``{"error": {"kind", "message", "details"}}``, and its status codes."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from producer.admission import TenantLimited
from producer.api.methods import allowed_methods
from producer.api.targets import slash_twin
from shared.errors import ArchiveUnavailable, StoreFull

__all__ = [
    "MAX_WHERE",
    "ApiError",
    "ErrorBody",
    "ErrorInfo",
    "answer_to",
    "error_place",
    "error_response",
    "install_error_handlers",
    "place_in",
]

log = logging.getLogger("wesichain.api")

#: How long a client is told to wait before it sends again a write that a full Redis refused.
_FULL_RETRY_S = 30


class ErrorInfo(BaseModel):
    kind: str = Field(
        description="What went wrong: bad_json, bad_request, invalid_request, unauthorized, forbidden,"
        " not_found, method_not_allowed, unknown_agent, quota_exceeded, wrong_state, conflict,"
        " thread_busy, run_ended, inbox_full, body_too_large, headers_too_large, request_timeout,"
        " unsupported_media_type, not_implemented, rate_limited, too_many_scans, too_many_streams,"
        " too_many_in_flight, store_full, unavailable, internal."
    )
    message: str = Field(description="A sentence for a human.")
    details: dict[str, Any] = Field(default_factory=dict, description="Machine-readable specifics.")


class ErrorBody(BaseModel):
    """Every error answer of the API."""

    error: ErrorInfo


class ApiError(Exception):
    """An answer other than success: its status, kind, message, details and extra headers."""

    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.details = details or {}
        self.headers = headers or {}


def error_response(
    status: int,
    kind: str,
    message: str,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorBody(error=ErrorInfo(kind=kind, message=message, details=details or {}))
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


#: The longest place an error names: a key may be nearly as long as the body, and one place is
#: named for each of up to 20 problems (and the places under a long key are longer still).
MAX_WHERE = 200


def place_in(where: str, part: str | int) -> str:
    """The place ``part`` of ``where`` as an error names it: a key with its lone surrogates escaped
    (no UTF-8 encoder takes them), the whole cut after ``MAX_WHERE`` characters ("..." ends it;
    the places under one cut are named as it is)."""
    if len(where) > MAX_WHERE:
        return where
    shown = str(part) if isinstance(part, int) else part[: MAX_WHERE + 1]
    place = f"{where}.{shown.encode('utf-8', 'backslashreplace').decode('utf-8')}"
    return place if len(place) <= MAX_WHERE else f"{place[:MAX_WHERE]}..."


def error_place(loc: Sequence[str | int]) -> str:
    """The place a validation error names for pydantic's ``loc`` (``body.metadata.key``), cut as
    :func:`place_in` cuts it: a key of the body's (an unexpected field) may be as long as the body."""
    if not loc:
        return ""
    where = str(loc[0])[:MAX_WHERE]
    for part in loc[1:]:
        where = place_in(where, part)
    return where


_KIND_OF_STATUS = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "body_too_large",
    415: "unsupported_media_type",
}


async def answer_to(app: FastAPI, scope: Scope, exc: Exception) -> Response:
    """The answer the app's exception handlers give ``exc``, raised by a request served outside
    the app's routing (``runs.SubmitShortcut``): the handler of its nearest class, as Starlette
    picks it, down to the one for any :class:`Exception` (a 500)."""
    for cls in type(exc).__mro__:
        handler = app.exception_handlers.get(cls)
        if handler is not None:
            answer = handler(Request({**scope, "app": app}), exc)
            return await answer if inspect.isawaitable(answer) else answer
    raise exc  # unreachable: install_error_handlers answers every Exception


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    @app.exception_handler(TenantLimited)
    async def _api_error(request: Request, exc: ApiError | TenantLimited) -> JSONResponse:
        return error_response(exc.status, exc.kind, exc.message, exc.details, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if isinstance(exc.body, bytes) and any(e.get("loc", ())[:1] == ("body",) for e in exc.errors()):
            # The route reads a JSON body and was handed bytes: its Content-Type is not JSON.
            declared = request.headers.get("content-type", "")[:100]
            sent_as = f"not {declared!r}" if declared else "and it had no Content-Type"
            return error_response(
                415,
                "unsupported_media_type",
                f"the request body must be JSON, sent as Content-Type: application/json, {sent_as}",
                {"content_type": declared},
            )
        problems = [
            {"where": error_place(e.get("loc", ())), "problem": str(e.get("msg", ""))[:300]}
            for e in exc.errors()[:20]
        ]
        if any(e.get("type") == "json_invalid" for e in exc.errors()):
            return error_response(
                400, "bad_json", "the request body is not valid JSON", {"problems": problems}
            )
        summary = "; ".join(f"{p['where']}: {p['problem']}" for p in problems[:5])
        return error_response(422, "invalid_request", summary, {"problems": problems})

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if isinstance(exc.__cause__, UnicodeDecodeError):
            # FastAPI read a JSON body that is not text (UTF-8, or UTF-16/32 by its first bytes).
            problem = {"where": f"body.{exc.__cause__.start}", "problem": "not UTF-8 text"}
            return error_response(
                400, "bad_json", "the request body is not valid JSON", {"problems": [problem]}
            )
        if exc.status_code == 404 and (twin := slash_twin(request)) is not None:
            return RedirectResponse(twin, status_code=307)
        kind = _KIND_OF_STATUS.get(exc.status_code, "http_error")
        headers = dict(exc.headers) if exc.headers else {}
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(request))  # not only the first route's
        return error_response(exc.status_code, kind, str(exc.detail), headers=headers or None)

    # Outages to wait out, not bugs: answered 503 with Retry-After, logged without a traceback.
    app.add_exception_handler(ArchiveUnavailable, _archive_unavailable)
    app.add_exception_handler(redis.ConnectionError, _store_down)
    app.add_exception_handler(redis.TimeoutError, _store_down)
    app.add_exception_handler(redis.exceptions.OutOfMemoryError, _store_full)
    app.add_exception_handler(StoreFull, _nearly_full)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        # The message of an unexpected exception may hold anything: it is logged, not returned.
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(500, "internal", f"unexpected {type(exc).__name__}; see the API's log")


async def _archive_unavailable(request: Request, exc: Exception) -> JSONResponse:
    # The run is in the archive and its database cannot be read now (it names no host here).
    log.warning("archive unavailable: %s", exc)
    return error_response(
        503,
        "unavailable",
        "the run archive cannot be read right now; try again",
        headers={"Retry-After": "5"},
    )


async def _store_down(request: Request, exc: Exception) -> JSONResponse:
    # Redis restarting or out of reach.
    log.warning("%s %s: the run store cannot be reached: %s", request.method, request.url.path, exc)
    return error_response(
        503,
        "unavailable",
        "the run store cannot be reached right now; try again",
        headers={"Retry-After": "1"},
    )


async def _store_full(request: Request, exc: Exception) -> JSONResponse:
    # Redis at maxmemory (noeviction) refused a write that adds data (a signal, a cancel, a
    # schedule, a thread's turn, ...): refused before it wrote anything (a script is refused at
    # its first such write), so the request can be sent again as it is once memory is freed.
    log.warning("%s %s: the run store is full: %s", request.method, request.url.path, exc)
    return error_response(
        503,
        "store_full",
        "Redis is full (maxmemory) and refused this write; send it again once memory is freed"
        " (raise maxmemory, shorten the retention, or run `wesichain gc`)",
        headers={"Retry-After": str(_FULL_RETRY_S)},
    )


async def _nearly_full(request: Request, exc: Exception) -> JSONResponse:
    # A new run (a submit, a fork, a pipeline) refused before Redis is full: the client's message
    # says how full it is and what to do.
    return error_response(503, "store_full", str(exc), headers={"Retry-After": str(_FULL_RETRY_S)})
