"""Clients of the HTTP API: :class:`ApiClient` (sync) and :class:`AsyncClient` (asyncio), on httpx.

They offer what :class:`~producer.client.Client` offers on Redis — submit, status, events, wait,
cancel, approve, deny — with an API key instead of Redis access::

    async with AsyncClient("https://agents.example.com", key="wsk_...") as client:
        handle = await client.submit("research", "What is a lease?", idempotency_key="q-1")
        async for event in handle.events():        # Server-Sent Events, resumed after a drop
            print(event.kind)
        head = await handle.wait(timeout=60)

``status()`` answers the same :class:`~shared.state.RunHead` as the Redis client; ``view()`` the
API's :class:`~shared.wire.RunView` (with the callback's delivery). Errors the API answers raise
the same exceptions as the Redis client where one exists (:class:`RunNotFound`,
:class:`InvalidRequest`, :class:`UnknownAgent`, :class:`NoLiveWorker` (retryable),
:class:`RequestConflict`, :class:`StoreFull`),
else :class:`ApiRequestError`; limits raise :class:`RateLimited` with the server's Retry-After,
and a queue namespace the key's tenant is not allowed :class:`Forbidden`.

Neither trusts the server with its memory: an answer is read up to ``max_answer_bytes``
(:data:`MAX_ANSWER_BYTES`), an event stream's line or event up to ``max_event_chars``
(:data:`MAX_EVENT_CHARS`); more raises :class:`AnswerTooLarge`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Collection, Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar

import httpx

from producer.client import (
    BulkJobNotFound,
    NoLiveWorker,
    RequestConflict,
    RunNotFound,
    RunTimeout,
    UnknownAgent,
)
from shared.assistant_store import AssistantsFull, AssistantSummary
from shared.assistants import (
    AssistantConfig,
    AssistantConflict,
    AssistantExists,
    AssistantInvalid,
    AssistantVersion,
    FieldChange,
    UnknownAssistant,
)
from shared.bulk import BulkJob, BulkOutcome
from shared.errors import InvalidRequest, StoreFull, ThreadBusy, WesichainError
from shared.evals.annotations import Annotation, AnnotationInput
from shared.evals.errors import EvalNotFound
from shared.events import END_EVENTS, EVENT_ADAPTER, Event
from shared.llm.framing import SseParser, StreamDecodeError
from shared.memory import Item, MemoryFull, SearchResult
from shared.pool import PoolView
from shared.search import SearchQuery
from shared.signals import MAX_WAIT_S, SignalView
from shared.state import Callback, Decision, Phase, RunHead, ThreadPolicy
from shared.timeline import Timeline
from shared.wire import AgentView, PipelineList, RunChildren, RunList, RunView, VersionView

if TYPE_CHECKING:
    from producer.api_schedules import ApiSchedules, AsyncSchedules

__all__ = [
    "MAX_ANSWER_BYTES",
    "MAX_EVENT_CHARS",
    "AnswerTooLarge",
    "ApiAssistants",
    "ApiClient",
    "ApiEvals",
    "ApiMemory",
    "ApiRequestError",
    "ApiRunHandle",
    "AsyncAssistants",
    "AsyncClient",
    "AsyncEvals",
    "AsyncMemory",
    "AsyncRunHandle",
    "ENV_API_KEY",
    "ENV_API_URL",
    "Forbidden",
    "ModelNotAllowed",
    "RESUME_FOR_S",
    "RateLimited",
    "Refusals",
]

ENV_API_URL = "WESICHAIN_API_URL"
ENV_API_KEY = "WESICHAIN_API_KEY"
#: Pause before following again after a dropped event stream.
_RESUME_S = 0.2
#: How long a dropped event stream is tried again (an API process restarting, a proxy's hiccup).
RESUME_FOR_S = 30.0
#: The largest answer the clients read (bytes, after any content encoding is undone): a page of
#: 200 runs at the API's largest inputs and answers fits many times over.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
#: The longest line, and event, of a run's event stream the clients read (characters).
MAX_EVENT_CHARS = 16 * 1024 * 1024


class ApiRequestError(WesichainError):
    """The API refused a request: its status, error kind, message and details."""

    def __init__(self, status: int, kind: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {kind}: {message}")
        self.status = status
        self.kind = kind
        self.message = message
        self.details = details or {}


class Forbidden(ApiRequestError):
    """The caller's tenant may not do this (a queue namespace it is not allowed: ``details``
    names the namespace and those it is allowed)."""


class ModelNotAllowed(Forbidden):
    """The caller's tenant may not name this model for a run (its own ``model``, or an
    assistant's): ``details`` name the model and those it is allowed."""


class RateLimited(ApiRequestError):
    """A tenant limit (submits per minute, runs in flight): try again after ``retry_after_s``."""

    def __init__(
        self, status: int, kind: str, message: str, details: dict[str, Any], retry_after_s: float
    ) -> None:
        super().__init__(status, kind, message, details)
        self.retry_after_s = retry_after_s


class AnswerTooLarge(ApiRequestError):
    """The API's answer is larger than the client reads (``max_answer_bytes``), or a line or an
    event of its event stream is (``max_event_chars``): a broken or hostile server. Its kind is
    ``answer_too_large``, its status the answer's; ``details`` name the limit."""


def _too_large(status: int, what: str, details: dict[str, Any]) -> AnswerTooLarge:
    return AnswerTooLarge(status, "answer_too_large", what, details)


class _Body:
    """An answer's body, read chunk by chunk up to ``limit`` bytes (after its content encoding is
    undone); :meth:`response` is the answer with it, as httpx would have read it whole."""

    def __init__(self, streamed: httpx.Response, limit: int) -> None:
        self.streamed = streamed
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        declared = streamed.headers.get("content-length", "")
        encoded = streamed.headers.get("content-encoding", "identity").lower() != "identity"
        if not encoded and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
            raise self.too_large()

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise self.too_large()
        self.parts.append(chunk)

    def too_large(self) -> AnswerTooLarge:
        request = self.streamed.request
        return _too_large(
            self.streamed.status_code,
            f"the answer to {request.method} {request.url.path} is larger than {self.limit} bytes",
            {"max_answer_bytes": self.limit},
        )

    def response(self) -> httpx.Response:
        # The body is decoded already: the answer no longer says how it was encoded or framed.
        headers = [
            (name, value)
            for name, value in self.streamed.headers.multi_items()
            if name.lower() not in ("content-encoding", "content-length", "transfer-encoding")
        ]
        return httpx.Response(
            self.streamed.status_code,
            headers=headers,
            content=b"".join(self.parts),
            request=self.streamed.request,
            extensions=self.streamed.extensions,
        )


#: The refusals of what the caller's tenant may not do, by kind.
_FORBIDDEN: dict[str, type[Forbidden]] = {"forbidden": Forbidden, "model_not_allowed": ModelNotAllowed}

#: How one operation reads an error kind of its own (an assistant's ``not_found`` is
#: :class:`UnknownAssistant`, not :class:`RunNotFound`): kind -> the exception, from the message
#: and details.
Refusals = Mapping[str, Callable[[str, dict[str, Any]], Exception]]


def _error_of(response: httpx.Response) -> tuple[str, str, dict[str, Any]]:
    """An error answer's kind, message and details (in the API's error shape)."""
    try:
        error = response.json()["error"]
        return str(error["kind"]), str(error["message"]), dict(error.get("details") or {})
    except (ValueError, KeyError, TypeError):
        return "http_error", response.text[:300], {}


def _raise_for(response: httpx.Response, refusals: Refusals | None = None) -> None:
    if response.status_code < 400:
        return
    kind, message, details = _error_of(response)
    status = response.status_code
    if refusals and kind in refusals:
        raise refusals[kind](message, details)
    if status == 404 and kind == "not_found":
        raise RunNotFound(message)
    if kind == "unknown_agent":
        raise UnknownAgent(message)
    if kind == "no_live_worker":
        refused = NoLiveWorker(message)
        refused.retry_after_s = float(response.headers.get("retry-after", "1"))
        raise refused
    if kind == "invalid_request":
        raise InvalidRequest(message, **details)
    if kind == "conflict":
        raise RequestConflict(message)
    if kind == "thread_busy":
        raise ThreadBusy(str(details.get("thread_id", "")), str(details.get("run_id", "")))
    if kind == "store_full":
        raise StoreFull(message)
    if kind == "quota_exceeded" and "max_memory_items" in details:
        raise MemoryFull(int(details["max_memory_items"]))
    if kind in _FORBIDDEN:
        raise _FORBIDDEN[kind](status, kind, message, details)
    if status == 429:
        raise RateLimited(status, kind, message, details, float(response.headers.get("retry-after", "1")))
    raise ApiRequestError(status, kind, message, details)


def _submit_body(
    agent: str,
    input: str,
    thread_id: str | None,
    metadata: dict[str, Any] | None,
    model: str | None,
    callback: Callback | dict[str, Any] | None,
    namespace: str | None,
    thread_policy: ThreadPolicy | None = None,
    assistant: str | None = None,
    assistant_version: int | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"agent": agent, "input": input}
    for name, value in (
        ("thread_id", thread_id),
        ("thread_policy", thread_policy),
        ("metadata", metadata),
        ("model", model),
        ("namespace", namespace),
        ("assistant", assistant),
        ("assistant_version", assistant_version),
    ):
        if value is not None:
            body[name] = value
    if callback is not None:
        body["callback"] = (
            callback.model_dump(exclude_none=True) if isinstance(callback, Callback) else callback
        )
    return body


def _headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _head(view: RunView) -> RunHead:
    return RunHead.model_validate(
        view.model_dump(exclude={"status", "callback_delivery", "waiting_for", "waiting_for_run"})
    )


def _list_params(**filters: Any) -> dict[str, Any]:
    return {k: v for k, v in filters.items() if v is not None}


def _decision_path(run_id: str, decision: Decision) -> str:
    return f"/v1/runs/{run_id}/{'approve' if decision.approve else 'deny'}"


def _decision_body(decision: Decision) -> dict[str, Any]:
    return {"note": decision.note, "always": True} if decision.always else {"note": decision.note}


class _Resumer:
    """Whether a failed attempt to follow is a drop to resume after (not a server never reached)."""

    def __init__(self) -> None:
        self.connected = False
        self.dropped_at: float | None = None

    def ok(self) -> None:
        self.connected, self.dropped_at = True, None

    def pause(self, exc: Exception) -> float:
        """Seconds to wait before trying again; re-raises when it is not a drop or took too long."""
        if not self.connected:
            raise exc
        now = time.monotonic()
        self.dropped_at = self.dropped_at or now
        if now - self.dropped_at > RESUME_FOR_S:
            raise exc
        return _RESUME_S


class _StreamEnded(WesichainError):
    """The API ended an event stream before the run's end event (its reader of the run failed,
    or it dropped a follower that fell behind): resume after the last event received."""


_DROPPED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.ConnectError, _StreamEnded)
#: Answers to a resume that mean "not now" (the API's Redis restarting, a proxy's upstream down).
_UNAVAILABLE = frozenset({502, 503, 504})


def _resumable(exc: ApiRequestError) -> bool:
    return exc.status in _UNAVAILABLE


def _env(url: str | None, key: str | None) -> tuple[str, str | None]:
    url = url or os.environ.get(ENV_API_URL, "")
    if not url:
        raise InvalidRequest(f"no API URL: pass one or set {ENV_API_URL}")
    return url.rstrip("/"), key if key is not None else os.environ.get(ENV_API_KEY)


# -- requests and their answers, for both clients --------------------------------------------------

_T = TypeVar("_T")


class _Request(NamedTuple):
    """One request to the API: what ``httpx``'s ``request`` takes, and how it reads its own
    error kinds (``refusals``)."""

    method: str
    path: str
    kwargs: dict[str, Any] = {}
    refusals: Refusals | None = None


#: An operation of the API, written once for both clients: a generator that yields the requests
#: it needs (each is sent the answer, errors already raised) or seconds to pause, and returns its
#: result. ``ApiClient`` runs it with blocking calls, ``AsyncClient`` awaiting them.
_Op = Generator[_Request | float, Any, _T]


def _parsed(request: _Request, parse: Callable[[httpx.Response], _T]) -> _Op[_T]:
    response = yield request
    return parse(response)


class _ClientBase:
    """What both clients share: the URL and key, the requests and how their answers read."""

    def __init__(
        self,
        url: str | None,
        key: str | None,
        timeout: float,
        httpx_options: dict[str, Any],
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        max_event_chars: int = MAX_EVENT_CHARS,
    ) -> None:
        if max_answer_bytes < 1 or max_event_chars < 1:
            raise InvalidRequest("max_answer_bytes and max_event_chars are at least 1")
        self.url, key = _env(url, key)
        self.max_answer_bytes = max_answer_bytes
        self.max_event_chars = max_event_chars
        self._http_options: dict[str, Any] = {
            "base_url": self.url,
            "headers": _headers(key),
            "timeout": timeout,
            **httpx_options,
        }

    def _submit(
        self,
        agent: str,
        input: str,
        thread_id: str | None,
        metadata: dict[str, Any] | None,
        model: str | None,
        callback: Callback | dict[str, Any] | None,
        idempotency_key: str | None,
        namespace: str | None,
        thread_policy: ThreadPolicy | None = None,
        assistant: str | None = None,
        assistant_version: int | None = None,
    ) -> _Op[str]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        body = _submit_body(
            agent,
            input,
            thread_id,
            metadata,
            model,
            callback,
            namespace,
            thread_policy,
            assistant,
            assistant_version,
        )
        request = _Request("POST", "/v1/runs", {"json": body, "headers": headers})
        return _parsed(request, lambda r: RunView.model_validate_json(r.content).run_id)

    @staticmethod
    def _list_runs(**filters: Any) -> _Op[RunList]:
        request = _Request("GET", "/v1/runs", {"params": _list_params(**filters)})
        return _parsed(request, lambda r: RunList.model_validate_json(r.content))

    @staticmethod
    def _list_pipelines(**filters: Any) -> _Op[PipelineList]:
        request = _Request("GET", "/v1/pipelines", {"params": _list_params(**filters)})
        return _parsed(request, lambda r: PipelineList.model_validate_json(r.content))

    @staticmethod
    def _agents() -> _Op[list[AgentView]]:
        return _parsed(
            _Request("GET", "/v1/agents"), lambda r: [AgentView.model_validate(a) for a in r.json()["agents"]]
        )

    @staticmethod
    def _pool(minutes: int) -> _Op[PoolView]:
        return _parsed(
            _Request("GET", "/v1/pool", {"params": {"minutes": minutes}}),
            lambda r: PoolView.model_validate(r.json()),
        )

    @staticmethod
    def _versions() -> _Op[list[VersionView]]:
        return _parsed(
            _Request("GET", "/v1/versions"),
            lambda r: [VersionView.model_validate(v) for v in r.json()["versions"]],
        )

    # -- search and bulk jobs (``/v1/runs/search``, ``/v1/bulk``) ---------------------------------

    @staticmethod
    def _search(
        query: SearchQuery | None, cursor: str | None, limit: int, filters: dict[str, Any]
    ) -> _Op[RunList]:
        body = {"query": _query_body(query, filters), "cursor": cursor, "limit": limit}
        request = _Request("POST", "/v1/runs/search", {"json": body})
        return _parsed(request, lambda r: RunList.model_validate_json(r.content))

    @staticmethod
    def _bulk(
        action: str, query: SearchQuery | None, rate_per_s: float | None, filters: dict[str, Any]
    ) -> _Op[BulkJob]:
        body: dict[str, Any] = {"action": action, "query": _query_body(query, filters)}
        if rate_per_s is not None:
            body["rate_per_s"] = rate_per_s
        return _parsed(_Request("POST", "/v1/bulk", {"json": body}), _bulk_job)

    @staticmethod
    def _bulk_job(job_id: str) -> _Op[BulkJob]:
        return _parsed(_Request("GET", _bulk_path(job_id), refusals=_BULK_REFUSALS), _bulk_job)

    @staticmethod
    def _bulk_jobs(limit: int) -> _Op[list[BulkJob]]:
        request = _Request("GET", "/v1/bulk", {"params": {"limit": limit}})
        return _parsed(request, lambda r: [BulkJob.model_validate(j) for j in r.json()["jobs"]])

    @staticmethod
    def _bulk_outcomes(job_id: str) -> _Op[dict[str, BulkOutcome]]:
        request = _Request("GET", f"{_bulk_path(job_id)}/runs", refusals=_BULK_REFUSALS)
        return _parsed(request, _outcomes)

    @classmethod
    def _cancel_bulk(cls, job_id: str) -> _Op[BulkJob]:
        # As the Redis client: a job that has ended already is answered as it is.
        job = yield from cls._bulk_job(job_id)
        if job.status != "running":
            return job
        request = _Request("POST", f"{_bulk_path(job_id)}/cancel", refusals=_BULK_REFUSALS)
        return (yield from _parsed(request, _bulk_job))


def _query_body(query: SearchQuery | None, filters: dict[str, Any]) -> dict[str, Any]:
    """A search's filters as the API takes them: a :class:`SearchQuery` or its fields as keywords
    (not both); the API checks them (422 naming what is wrong)."""
    if query is not None and filters:
        raise InvalidRequest("give a SearchQuery or keyword filters, not both")
    if query is not None:
        return query.model_dump(mode="json", exclude_defaults=True)
    return {name: value for name, value in filters.items() if value is not None}


def _bulk_path(job_id: str) -> str:
    # Job ids are hex: anything else is refused here rather than sent as a path of its own.
    if not job_id or len(job_id) > 64 or any(c not in "0123456789abcdef" for c in job_id):
        raise BulkJobNotFound(f"no bulk job {job_id[:80]!r}")
    return f"/v1/bulk/{job_id}"


def _bulk_job(response: httpx.Response) -> BulkJob:
    return BulkJob.model_validate_json(response.content)


def _outcomes(response: httpx.Response) -> dict[str, BulkOutcome]:
    listed = [BulkOutcome.model_validate(o) for o in response.json()["outcomes"]]
    return {outcome.run_id: outcome for outcome in listed}


_BULK_REFUSALS: Refusals = {"not_found": lambda message, _: BulkJobNotFound(message)}


def _assistant_invalid(message: str, details: dict[str, Any]) -> Exception:
    field = details.get("field")
    return AssistantInvalid(str(field), message) if field else InvalidRequest(message, **details)


def _assistants_full(message: str, details: dict[str, Any]) -> Exception:
    frees_at = details.get("frees_at")
    return AssistantsFull(
        int(details.get("max_assistant_bytes", 0)),
        int(details.get("held_bytes", 0)),
        float(frees_at) if frees_at is not None else None,
    )


#: The assistants' errors as the Redis client raises them (``shared/assistants.py``).
_ASSISTANT_REFUSALS: Refusals = {
    "not_found": lambda message, _: UnknownAssistant(message),
    "conflict": lambda message, _: AssistantConflict(message),
    "invalid_request": _assistant_invalid,
    "quota_exceeded": _assistants_full,
}
_CREATE_REFUSALS: Refusals = {
    **_ASSISTANT_REFUSALS,
    "conflict": lambda message, _: AssistantExists(message),
}


def _assistant_path(name: str) -> str:
    # Names are letters, digits and . _ - : anything else cannot name an assistant.
    if not name or len(name) > 100 or not all(c.isascii() and (c.isalnum() or c in "._-") for c in name):
        raise UnknownAssistant(f"no assistant {name[:80]!r}")
    return f"/v1/assistants/{name}"


def _config_body(config: AssistantConfig | dict[str, Any]) -> dict[str, Any]:
    if isinstance(config, AssistantConfig):
        return config.model_dump(mode="json", exclude_unset=True)
    return dict(config)


def _version(response: httpx.Response) -> AssistantVersion:
    return AssistantVersion.model_validate_json(response.content)


class _AssistantOps:
    """``/v1/assistants``, for both clients' ``assistants``."""

    @staticmethod
    def _create(name: str, agent: str, config: AssistantConfig | dict[str, Any]) -> _Op[AssistantVersion]:
        body = {"name": name, "agent": agent, "config": _config_body(config)}
        return _parsed(_Request("POST", "/v1/assistants", {"json": body}, _CREATE_REFUSALS), _version)

    @staticmethod
    def _update(
        name: str, config: AssistantConfig | dict[str, Any], if_version: int | None
    ) -> _Op[AssistantVersion]:
        body = {"config": _config_body(config), "if_version": if_version}
        request = _Request("PUT", _assistant_path(name), {"json": body}, _ASSISTANT_REFUSALS)
        return _parsed(request, _version)

    @staticmethod
    def _rollback(name: str, version: int, if_version: int | None) -> _Op[AssistantVersion]:
        body = {"version": version, "if_version": if_version}
        request = _Request("POST", f"{_assistant_path(name)}/rollback", {"json": body}, _ASSISTANT_REFUSALS)
        return _parsed(request, _version)

    @staticmethod
    def _delete(name: str) -> _Op[None]:
        return _parsed(_Request("DELETE", _assistant_path(name), {}, _ASSISTANT_REFUSALS), lambda _: None)

    @staticmethod
    def _get(name: str, version: int | None) -> _Op[AssistantVersion]:
        params = {"version": version} if version is not None else {}
        request = _Request("GET", _assistant_path(name), {"params": params}, _ASSISTANT_REFUSALS)
        return _parsed(request, _version)

    @staticmethod
    def _versions(name: str, before: int | None, limit: int) -> _Op[list[AssistantVersion]]:
        params = _list_params(before=before, limit=limit)
        request = _Request(
            "GET", f"{_assistant_path(name)}/versions", {"params": params}, _ASSISTANT_REFUSALS
        )
        return _parsed(request, lambda r: [AssistantVersion.model_validate(v) for v in r.json()["versions"]])

    @staticmethod
    def _diff(name: str, before: int, after: int) -> _Op[list[FieldChange]]:
        params = {"from": before, "to": after}
        request = _Request("GET", f"{_assistant_path(name)}/diff", {"params": params}, _ASSISTANT_REFUSALS)
        return _parsed(request, lambda r: [FieldChange.model_validate(c) for c in r.json()["changes"]])

    @staticmethod
    def _list(after: str | None, limit: int) -> _Op[list[AssistantSummary]]:
        request = _Request("GET", "/v1/assistants", {"params": _list_params(after=after, limit=limit)})
        return _parsed(
            request,
            lambda r: [
                AssistantSummary(
                    name=str(a["name"]),
                    agent=str(a["agent"]),
                    version=int(a["version"]),
                    updated_at=float(a["updated_at"]),
                )
                for a in r.json()["assistants"]
            ],
        )


class _Absent(WesichainError):
    """A memory item the tenant does not have (``get`` answers None)."""


_MEMORY_REFUSALS: Refusals = {"not_found": lambda message, _: _Absent(message)}


class _MemoryOps:
    """``/v1/memory``, for both clients' ``memory``."""

    @staticmethod
    def _put(namespace: Sequence[str], key: str, value: dict[str, Any], ttl_s: float | None) -> _Op[Item]:
        body = {"namespace": list(namespace), "key": key, "value": value, "ttl_s": ttl_s}
        return _parsed(
            _Request("PUT", "/v1/memory/items", {"json": body}), lambda r: Item.model_validate_json(r.content)
        )

    @staticmethod
    def _get(namespace: Sequence[str], key: str) -> _Op[Item]:
        params = {"namespace": list(namespace), "key": key}
        request = _Request("GET", "/v1/memory/items", {"params": params}, _MEMORY_REFUSALS)
        return _parsed(request, lambda r: Item.model_validate_json(r.content))

    @staticmethod
    def _delete(namespace: Sequence[str], key: str) -> _Op[bool]:
        params = {"namespace": list(namespace), "key": key}
        request = _Request("DELETE", "/v1/memory/items", {"params": params})
        return _parsed(request, lambda r: bool(r.json()["deleted"]))

    @staticmethod
    def _search(
        namespace_prefix: Sequence[str],
        query: str | None,
        filter: dict[str, Any] | None,
        limit: int,
        offset: int,
        semantic: bool,
    ) -> _Op[SearchResult]:
        body: dict[str, Any] = {
            "namespace_prefix": list(namespace_prefix),
            "query": query,
            "filter": filter,
            "limit": limit,
            "offset": offset,
        }
        if semantic:
            body["semantic"] = True
        request = _Request("POST", "/v1/memory/items/search", {"json": body})
        return _parsed(request, lambda r: SearchResult.model_validate_json(r.content))

    @staticmethod
    def _list_namespaces(
        prefix: Sequence[str], max_depth: int | None, limit: int, offset: int
    ) -> _Op[list[tuple[str, ...]]]:
        body = {"prefix": list(prefix), "max_depth": max_depth, "limit": limit, "offset": offset}
        request = _Request("POST", "/v1/memory/namespaces", {"json": body})
        return _parsed(request, lambda r: [tuple(ns) for ns in r.json()["namespaces"]])


_EVAL_REFUSALS: Refusals = {"not_found": lambda message, _: EvalNotFound(message)}
#: What an eval id may be to name one path segment of ``/v1/evals/{id}`` (an id holding "/" cannot).
_EVAL_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:@-")


def _eval_path(eval_id: str) -> str:
    if not eval_id or len(eval_id) > 200 or not set(eval_id) <= _EVAL_ID_CHARS:
        raise EvalNotFound(f"no eval {eval_id[:80]!r} the API can name")
    return f"/v1/evals/{eval_id}"


class _EvalOps:
    """``/v1/evals``, for both clients' ``evals``: the key's tenant's evals as the viewer reads
    them (another tenant's eval is :class:`EvalNotFound`, as one that does not exist)."""

    @staticmethod
    def _list(limit: int) -> _Op[list[dict[str, Any]]]:
        request = _Request("GET", "/v1/evals", {"params": {"limit": limit}})
        return _parsed(request, lambda r: list(r.json()["evals"]))

    @staticmethod
    def _get(eval_id: str) -> _Op[dict[str, Any]]:
        return _parsed(
            _Request("GET", _eval_path(eval_id), refusals=_EVAL_REFUSALS), lambda r: dict(r.json())
        )

    @staticmethod
    def _results(eval_id: str, format: str) -> _Op[str]:
        request = _Request(
            "GET", f"{_eval_path(eval_id)}/results", {"params": {"format": format}}, _EVAL_REFUSALS
        )
        return _parsed(request, lambda r: r.text)

    @staticmethod
    def _compare(baseline: str, candidate: str) -> _Op[dict[str, Any]]:
        path = f"{_eval_path(baseline)}/compare/{_eval_path(candidate).rsplit('/', 1)[1]}"
        return _parsed(_Request("GET", path, refusals=_EVAL_REFUSALS), lambda r: dict(r.json()))

    @staticmethod
    def _annotate(eval_id: str, item: str, review: AnnotationInput) -> _Op[Annotation]:
        if not item or len(item) > 40 or not set(item) <= _EVAL_ID_CHARS:
            raise EvalNotFound(f"eval {eval_id[:80]!r} has no case run {item[:40]!r}")
        body = review.model_dump(mode="json")
        request = _Request("PUT", f"{_eval_path(eval_id)}/annotations/{item}", {"json": body}, _EVAL_REFUSALS)
        return _parsed(request, lambda r: Annotation.model_validate_json(r.content))

    @staticmethod
    def _annotations(eval_id: str) -> _Op[tuple[list[Annotation], list[Annotation]]]:
        def read(r: httpx.Response) -> tuple[list[Annotation], list[Annotation]]:
            body = r.json()
            return (
                [Annotation.model_validate(a) for a in body["latest"]],
                [Annotation.model_validate(a) for a in body["history"]],
            )

        return _parsed(_Request("GET", f"{_eval_path(eval_id)}/annotations", refusals=_EVAL_REFUSALS), read)


class _RunOps:
    """One run's operations over the API, for both run handles."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def _view(self) -> _Op[RunView]:
        return _parsed(
            _Request("GET", f"/v1/runs/{self.run_id}"), lambda r: RunView.model_validate_json(r.content)
        )

    def _status(self) -> _Op[RunHead]:
        return _head((yield from self._view()))

    def _checkpoints(self) -> _Op[list[RunHead]]:
        heads: list[RunHead] = []
        after: int | None = 0
        while after is not None:
            response = yield _Request(
                "GET", f"/v1/runs/{self.run_id}/checkpoints", {"params": {"after_version": after}}
            )
            page = response.json()
            heads.extend(_head(RunView.model_validate(c)) for c in page["checkpoints"])
            after = page["next_after_version"]
        return heads

    def _timeline(self) -> _Op[Timeline]:
        return _parsed(
            _Request("GET", f"/v1/runs/{self.run_id}/timeline"),
            lambda r: Timeline.model_validate_json(r.content),
        )

    def _children(self) -> _Op[list[RunView]]:
        return _parsed(
            _Request("GET", f"/v1/runs/{self.run_id}/children"),
            lambda r: RunChildren.model_validate_json(r.content).runs,
        )

    def _retry(self, key: str | None) -> _Op[str]:
        headers = {"Idempotency-Key": key} if key else {}
        request = _Request("POST", f"/v1/runs/{self.run_id}/retry", {"headers": headers})
        return _parsed(request, lambda r: RunView.model_validate_json(r.content).run_id)

    def _wait(self, timeout: float) -> _Op[RunHead]:
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            head = yield from self._status()
            if head.terminal:
                return head
            if time.monotonic() >= deadline:
                raise RunTimeout(f"run {self.run_id} still {head.phase.value} after {timeout}s")
            yield min(delay, max(0.0, deadline - time.monotonic()))
            delay = min(delay * 2, 0.2)

    def _fork(self, version: int | None, input: str | None) -> _Op[str]:
        body = _list_params(version=version, input=input)
        request = _Request("POST", f"/v1/runs/{self.run_id}/fork", {"json": body})
        return _parsed(request, lambda r: RunView.model_validate_json(r.content).run_id)

    def _cancel(self) -> _Op[Phase | None]:
        return _parsed(
            _Request("POST", f"/v1/runs/{self.run_id}/cancel"),
            lambda r: Phase(RunView.model_validate_json(r.content).phase),
        )

    def _decide(self, decision: Decision) -> _Op[None]:
        yield _Request("POST", _decision_path(self.run_id, decision), {"json": _decision_body(decision)})

    def _send_signal(self, path: str, body: dict[str, Any], key: str | None) -> _Op[SignalView]:
        headers = {"Idempotency-Key": key} if key else {}
        request = _Request("POST", f"/v1/runs/{self.run_id}/{path}", {"json": body, "headers": headers})
        return _parsed(request, lambda r: SignalView.model_validate_json(r.content))

    def _signal(self, signal_id: int, wait: float) -> _Op[SignalView]:
        """One signal's outcome; the server waits at most its limit a request, so a longer ``wait``
        asks again until it is no longer pending or the time is up."""
        deadline = time.monotonic() + max(wait, 0.0)
        while True:
            left = max(0.0, deadline - time.monotonic())
            request = _Request(
                "GET",
                f"/v1/runs/{self.run_id}/signals/{signal_id}",
                {"params": {"wait": min(left, MAX_WAIT_S)}},
            )
            view = yield from _parsed(request, lambda r: SignalView.model_validate_json(r.content))
            if view.status != "pending" or time.monotonic() >= deadline:
                return view

    def _update(self, patch: dict[str, Any], key: str | None, wait: float | None) -> _Op[SignalView]:
        sent = yield from self._send_signal("updates", {"patch": patch}, key)
        if wait is None or sent.status != "pending":
            return sent
        return (yield from self._signal(sent.id, wait))

    def _page(self, cursor: str) -> _Request:
        """A page of stored events after ``cursor`` (the JSON mode of the events endpoint)."""
        return _Request("GET", f"/v1/runs/{self.run_id}/events", {"params": {"after": cursor, "limit": 500}})


def _page_events(response: httpx.Response) -> tuple[list[Event], bool]:
    """A page's events, and whether it was the last."""
    page = response.json()
    events = []
    for raw in page["events"]:
        event = EVENT_ADAPTER.validate_python(raw)
        event.stream_id = str(raw["id"])
        events.append(event)
    return events, bool(page["ended"] or not page["events"])


def _sse_event(data: str) -> Event:
    raw = json.loads(data)
    event = EVENT_ADAPTER.validate_python(raw)
    event.stream_id = str(raw["id"])
    return event


def _followed_submit(body: dict[str, Any], idempotency_key: str | None) -> dict[str, Any]:
    """The keyword arguments of a submit that asks for the new run's event stream as its answer."""
    key = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return {"json": body, "headers": {"Accept": "text/event-stream", **key}}


def _streamed_run(response: httpx.Response) -> str | None:
    """The run a submit answered with its event stream names (``Location``); None: the answer is
    the run as JSON (a server that does not stream a submit's answer)."""
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        return None
    return response.headers["location"].rsplit("/", 1)[-1]


class _Follow:
    """Following a run's event stream, without the I/O: each attempt's request, its answer's
    events, and whether (and after how long) a failed attempt is resumed."""

    #: What ends an attempt to be resumed (or, for ``ReadTimeout``, ends following).
    RETRIED = (httpx.ReadTimeout, *_DROPPED, ApiRequestError)

    def __init__(
        self,
        run_id: str,
        after: str,
        connect_timeout: float | None,
        idle_timeout: float | None,
        kinds: Collection[str] | None = None,
        max_event_chars: int = MAX_EVENT_CHARS,
    ) -> None:
        # The server sends only these kinds, and the end event, which ends following as ever.
        only = f"?kinds={','.join(sorted(kinds))}" if kinds is not None else ""
        self.path = f"/v1/runs/{run_id}/events{only}"
        self.run_id = run_id
        self.cursor = after
        self.timeout = httpx.Timeout(connect_timeout, read=idle_timeout)
        self.idle_timeout = idle_timeout
        #: When the last event came (or following began): the server's keep-alives are no events.
        self.last_event_at = time.monotonic()
        self.resumer = _Resumer()
        #: Following is over: the run's end event came, or no event for ``idle_timeout``.
        self.ended = False
        self.max_event_chars = max_event_chars
        self.parser = SseParser(max_chars=max_event_chars)

    def headers(self) -> dict[str, str]:
        return {"Accept": "text/event-stream", "Last-Event-ID": self.cursor}

    def opened(self, response: httpx.Response) -> bool:
        """Whether the stream has events to read (its body read already when it is an error)."""
        if response.status_code == 204:
            return False  # resumed after the end event
        _raise_for(response)
        self.resumer.ok()
        self.parser = SseParser(max_chars=self.max_event_chars)
        return True

    def events(self, chunk: bytes) -> Iterator[Event]:
        """The events completed by ``chunk``, up to the run's end event; raises
        :class:`AnswerTooLarge` for a line or an event over ``max_event_chars``."""
        try:
            messages = self.parser.feed(chunk)
        except StreamDecodeError:
            raise _too_large(
                200,
                f"a line or an event of the event stream of run {self.run_id} is longer than"
                f" {self.max_event_chars} characters",
                {"max_event_chars": self.max_event_chars},
            ) from None
        now = time.monotonic()
        for message in messages:
            event = _sse_event(message.data)
            self.cursor = event.stream_id or self.cursor
            self.last_event_at = now
            yield event
            if event.kind in END_EVENTS:
                self.ended = True
                return
        # A stream's keep-alives reset the read timeout, not this: a run parked for longer than
        # ``idle_timeout`` ends following, at the first keep-alive after it.
        if self.idle_timeout is not None and now - self.last_event_at >= self.idle_timeout:
            self.ended = True

    def ended_early(self) -> _StreamEnded:
        # Ended before the end event. If the run ended and its remaining events were trimmed,
        # the resume is answered 204; otherwise it carries on.
        return _StreamEnded(f"the event stream of run {self.run_id} ended early")

    def pause(self, exc: Exception) -> float | None:
        """Seconds to wait before resuming after ``exc``; None: stop (idle for ``idle_timeout``).
        Re-raises what is not a drop to resume after."""
        if isinstance(exc, httpx.ReadTimeout):
            return None
        if isinstance(exc, ApiRequestError) and not _resumable(exc):
            raise exc
        return self.resumer.pause(exc)


# -- sync ------------------------------------------------------------------------------------------


class ApiMemory(_MemoryOps):
    """The key's tenant's long-term memory over ``/v1/memory`` (``Memory``'s surface)."""

    def __init__(self, client: ApiClient) -> None:
        self._client = client

    def put(
        self, namespace: Sequence[str], key: str, value: dict[str, Any], *, ttl_s: float | None = None
    ) -> Item:
        return self._client._run(self._put(namespace, key, value, ttl_s))

    def get(self, namespace: Sequence[str], key: str) -> Item | None:
        try:
            return self._client._run(self._get(namespace, key))
        except _Absent:
            return None

    def delete(self, namespace: Sequence[str], key: str) -> bool:
        return self._client._run(self._delete(namespace, key))

    def search(
        self,
        namespace_prefix: Sequence[str] = (),
        *,
        query: str | None = None,
        filter: dict[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        semantic: bool = False,
    ) -> SearchResult:
        """``semantic``: rank by similarity to ``query`` (where an embedding function is
        configured; see ``Memory.search``)."""
        return self._client._run(self._search(namespace_prefix, query, filter, limit, offset, semantic))

    def list_namespaces(
        self, *, prefix: Sequence[str] = (), max_depth: int | None = None, limit: int = 100, offset: int = 0
    ) -> list[tuple[str, ...]]:
        return self._client._run(self._list_namespaces(prefix, max_depth, limit, offset))


class ApiAssistants(_AssistantOps):
    """The key's tenant's assistants over ``/v1/assistants`` (``client.assistants``' surface; the
    same exceptions: ``UnknownAssistant``, ``AssistantExists``, ``AssistantConflict``,
    ``AssistantInvalid``)."""

    def __init__(self, client: ApiClient) -> None:
        self._client = client

    def create(self, name: str, agent: str, config: AssistantConfig | dict[str, Any]) -> AssistantVersion:
        return self._client._run(self._create(name, agent, config))

    def update(
        self, name: str, config: AssistantConfig | dict[str, Any], *, if_version: int | None = None
    ) -> AssistantVersion:
        return self._client._run(self._update(name, config, if_version))

    def rollback(self, name: str, version: int, *, if_version: int | None = None) -> AssistantVersion:
        return self._client._run(self._rollback(name, version, if_version))

    def delete(self, name: str) -> None:
        self._client._run(self._delete(name))

    def get(self, name: str, *, version: int | None = None) -> AssistantVersion:
        return self._client._run(self._get(name, version))

    def versions(self, name: str, *, before: int | None = None, limit: int = 50) -> list[AssistantVersion]:
        return self._client._run(self._versions(name, before, limit))

    def diff(self, name: str, before: int, after: int) -> list[FieldChange]:
        return self._client._run(self._diff(name, before, after))

    def list(self, *, after: str | None = None, limit: int = 100) -> list[AssistantSummary]:
        return self._client._run(self._list(after, limit))


class ApiEvals(_EvalOps):
    """The key's tenant's evals over ``/v1/evals``: what the viewer at ``/evals/`` reads. An eval
    that is not the tenant's (or does not exist) raises :class:`EvalNotFound`."""

    def __init__(self, client: ApiClient) -> None:
        self._client = client

    def get(self, eval_id: str) -> dict[str, Any]:
        """One eval as the viewer shows it: context, verdict, summary, breakdown, cases, labels."""
        return self._client._run(self._get(eval_id))

    def results(self, eval_id: str, *, format: str = "csv") -> str:
        """One row per case run as ``csv``, ``jsonl`` or ``junit`` text, reviews beside the scores."""
        return self._client._run(self._results(eval_id, format))

    def compare(self, baseline: str, candidate: str) -> dict[str, Any]:
        """The paired test of two evals per variant (McNemar's), each pair, and the human agreement."""
        return self._client._run(self._compare(baseline, candidate))

    def annotate(
        self,
        eval_id: str,
        item: str,
        *,
        label: Literal["pass", "fail"] | None = None,
        scores: dict[str, float] | None = None,
        note: str = "",
    ) -> Annotation:
        """Review case run ``item`` (``variant:case:repeat``); the reviewer is the API key."""
        review = AnnotationInput(label=label, scores=scores or {}, note=note)
        return self._client._run(self._annotate(eval_id, item, review))

    def annotations(self, eval_id: str) -> tuple[list[Annotation], list[Annotation]]:
        """(each reviewed case run's latest annotation, every annotation oldest first)."""
        return self._client._run(self._annotations(eval_id))

    def list(self, *, limit: int = 50) -> list[dict[str, Any]]:
        """The newest evals, newest first: id, name, status, times, verdict, each variant's figures."""
        return self._client._run(self._list(limit))


class ApiClient(_ClientBase):
    """The HTTP API, synchronously: the Redis client's surface with an API key."""

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout: float = 30.0,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        max_event_chars: int = MAX_EVENT_CHARS,
        **httpx_options: Any,
    ) -> None:
        super().__init__(url, key, timeout, httpx_options, max_answer_bytes, max_event_chars)
        self.http = httpx.Client(**self._http_options)

    @classmethod
    def from_env(cls) -> ApiClient:
        """``WESICHAIN_API_URL`` and ``WESICHAIN_API_KEY``."""
        return cls()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    @property
    def memory(self) -> ApiMemory:
        """The long-term memory of the key's tenant."""
        return ApiMemory(self)

    @property
    def assistants(self) -> ApiAssistants:
        """The key's tenant's assistants."""
        return ApiAssistants(self)

    @property
    def evals(self) -> ApiEvals:
        """The key's tenant's evals."""
        return ApiEvals(self)

    @property
    def schedules(self) -> ApiSchedules:
        """The key's tenant's schedules (``producer/api_schedules.py``)."""
        from producer.api_schedules import ApiSchedules

        return ApiSchedules(self)

    def _call(
        self, method: str, path: str, *, refusals: Refusals | None = None, **kwargs: Any
    ) -> httpx.Response:
        with self.http.stream(method, path, **kwargs) as streamed:
            response = self._read(streamed)
        _raise_for(response, refusals)
        return response

    def _read(self, streamed: httpx.Response) -> httpx.Response:
        """A streamed answer read whole, up to ``max_answer_bytes``."""
        body = _Body(streamed, self.max_answer_bytes)
        for chunk in streamed.iter_bytes():
            body.add(chunk)
        return body.response()

    def _run(self, op: _Op[_T]) -> _T:
        answer: httpx.Response | None = None
        try:
            while True:
                step = op.send(answer)
                if isinstance(step, _Request):
                    answer = self._call(step.method, step.path, refusals=step.refusals, **step.kwargs)
                else:
                    answer = None
                    time.sleep(step)
        except StopIteration as done:
            result: _T = done.value
            return result

    def submit(
        self,
        agent: str,
        input: str,
        *,
        thread_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        model: str | None = None,
        callback: Callback | dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        namespace: str | None = None,
        thread_policy: ThreadPolicy | None = None,
        assistant: str | None = None,
        assistant_version: int | None = None,
    ) -> ApiRunHandle:
        """Start a run; with ``idempotency_key`` a retried submit returns the same run; with
        ``namespace``, on that queue namespace (one the key's tenant is allowed: else 403); with
        ``thread_policy`` ``reject`` on a busy thread, raises :class:`ThreadBusy` naming the busy run;
        with ``assistant``, as the key's tenant's assistant of that name configures the agent (its
        current version, or ``assistant_version``)."""
        op = self._submit(
            agent,
            input,
            thread_id,
            metadata,
            model,
            callback,
            idempotency_key,
            namespace,
            thread_policy,
            assistant,
            assistant_version,
        )
        return ApiRunHandle(self, self._run(op))

    def submit_and_follow(
        self,
        agent: str,
        input: str,
        *,
        thread_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        model: str | None = None,
        callback: Callback | dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        namespace: str | None = None,
        thread_policy: ThreadPolicy | None = None,
        assistant: str | None = None,
        assistant_version: int | None = None,
        idle_timeout: float | None = None,
    ) -> Iterator[Event]:
        """Start a run (as :meth:`submit`) and follow its events from the first to its end event,
        in one request: the submit is answered with the run's event stream. Every event names the
        run (``run_id``). A stream dropped after its answer began is resumed as
        :meth:`ApiRunHandle.events` resumes; a refused submit raises as :meth:`submit` does (a
        503 is not waited out: send it again, with ``idempotency_key`` if it may have started)."""
        body = _submit_body(
            agent,
            input,
            thread_id,
            metadata,
            model,
            callback,
            namespace,
            thread_policy,
            assistant,
            assistant_version,
        )
        timeout = httpx.Timeout(self.http.timeout.connect, read=idle_timeout)
        with self.http.stream(
            "POST", "/v1/runs", timeout=timeout, **_followed_submit(body, idempotency_key)
        ) as r:
            if r.status_code >= 400:
                _raise_for(self._read(r))
            streamed = _streamed_run(r)
            run_id = streamed or RunView.model_validate_json(self._read(r).content).run_id
            f = _Follow(run_id, "0-0", timeout.connect, idle_timeout, None, self.max_event_chars)
            if streamed is not None and f.opened(r):
                try:
                    for chunk in r.iter_bytes():
                        yield from f.events(chunk)
                        if f.ended:
                            return
                except httpx.ReadTimeout:
                    return  # idle for idle_timeout: following ends, as for a handle's events
                except _DROPPED:
                    pass  # resumed below, after the last event received
        # Resumed with the same follower: it was connected, so a server restarting is waited for.
        yield from ApiRunHandle(self, run_id)._follow(f)

    def handle(self, run_id: str) -> ApiRunHandle:
        return ApiRunHandle(self, run_id)

    def list_runs(
        self,
        *,
        agent: str | None = None,
        status: str | None = None,
        thread_id: str | None = None,
        since: float | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> RunList:
        return self._run(
            self._list_runs(
                agent=agent, status=status, thread_id=thread_id, since=since, cursor=cursor, limit=limit
            )
        )

    def list_pipelines(
        self,
        *,
        pipeline: str | None = None,
        status: str | None = None,
        since: float | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> PipelineList:
        """The caller's pipeline runs, newest first (``pipeline``: only runs of that pipeline)."""
        return self._run(
            self._list_pipelines(pipeline=pipeline, status=status, since=since, cursor=cursor, limit=limit)
        )

    def agents(self) -> list[AgentView]:
        return self._run(self._agents())

    def versions(self) -> list[VersionView]:
        """Agent versions live in the pool, and how many of this tenant's runs each holds."""
        return self._run(self._versions())

    def search(
        self,
        query: SearchQuery | None = None,
        *,
        cursor: str | None = None,
        limit: int = 50,
        **filters: Any,
    ) -> RunList:
        """The key's tenant's runs matching ``query`` (or :class:`SearchQuery`'s fields as keywords:
        ``agent``, ``version``, ``status``, ``error_kind``, ``thread_id``, ``since``, ``until``,
        ``metadata``), newest first, live and archived; ``next_cursor`` continues the search."""
        return self._run(self._search(query, cursor, limit, filters))

    def bulk(
        self,
        action: str,
        query: SearchQuery | None = None,
        *,
        rate_per_s: float | None = None,
        **filters: Any,
    ) -> BulkJob:
        """Start a bulk job (``retry``, ``fork`` or ``cancel``) on every run the search finds."""
        return self._run(self._bulk(action, query, rate_per_s, filters))

    def bulk_job(self, job_id: str) -> BulkJob:
        """A bulk job of the key's tenant; raises :class:`BulkJobNotFound`."""
        return self._run(self._bulk_job(job_id))

    def bulk_jobs(self, *, limit: int = 50) -> list[BulkJob]:
        return self._run(self._bulk_jobs(limit))

    def bulk_outcomes(self, job_id: str) -> dict[str, BulkOutcome]:
        """What a bulk job did to each run it got to (the first 1000, by run id)."""
        return self._run(self._bulk_outcomes(job_id))

    def cancel_bulk(self, job_id: str) -> BulkJob:
        """Stop a running bulk job (one that ended already is answered as it is)."""
        return self._run(self._cancel_bulk(job_id))

    def pool(self, minutes: int = 60) -> PoolView:
        """The pool as this key may see it (``GET /v1/pool``): the operator's whole view, or a
        tenant's pool-wide counts and its own runs."""
        return self._run(self._pool(minutes))


class ApiRunHandle(_RunOps):
    """One run over the API: its status, its events, and the cancel and approval verbs."""

    def __init__(self, client: ApiClient, run_id: str) -> None:
        super().__init__(run_id)
        self.client = client

    def __repr__(self) -> str:
        return f"ApiRunHandle({self.run_id!r})"

    def view(self) -> RunView:
        return self.client._run(self._view())

    def status(self) -> RunHead:
        return self.client._run(self._status())

    def checkpoints(self) -> list[RunHead]:
        """Every committed state, in version order (read a page at a time)."""
        return self.client._run(self._checkpoints())

    def timeline(self) -> Timeline:
        """Where the run's time went (see ``RunHandle.timeline``)."""
        return self.client._run(self._timeline())

    def children(self) -> list[RunView]:
        """The run's subagent runs, in the order its steps started them."""
        return self.client._run(self._children())

    def retry(self, *, idempotency_key: str | None = None) -> ApiRunHandle:
        """A fresh run with this ended run's request (see ``Client.retry``)."""
        return ApiRunHandle(self.client, self.client._run(self._retry(idempotency_key)))

    def _paged(self, cursor: str) -> Iterator[Event]:
        """The stored events after ``cursor``, page by page (the JSON mode of the events endpoint)."""
        while True:
            request = self._page(cursor)
            events, last = _page_events(self.client._call(request.method, request.path, **request.kwargs))
            for event in events:
                cursor = event.stream_id or cursor
                yield event
            if last:
                return

    def events(
        self,
        *,
        follow: bool = True,
        after: str = "0-0",
        idle_timeout: float | None = None,
        kinds: Collection[str] | None = None,
    ) -> Iterator[Event]:
        """Every event after ``after``, in order; with ``follow``, live until the end event.

        A dropped stream is resumed after the last event received (``Last-Event-ID``), so no event
        is lost or repeated. ``idle_timeout`` ends following when no event arrived for that long
        (the stream's keep-alives are none).
        ``kinds``: only events of these kinds (e.g. ``{"CustomEvent"}``), and the run's end event.
        """
        if not follow:
            wanted = set(kinds) | set(END_EVENTS) if kinds is not None else None
            yield from (e for e in self._paged(after) if wanted is None or e.kind in wanted)
            return
        timeout = self.client.http.timeout.connect
        yield from self._follow(
            _Follow(self.run_id, after, timeout, idle_timeout, kinds, self.client.max_event_chars)
        )

    def _follow(self, f: _Follow) -> Iterator[Event]:
        """The run's events after ``f``'s cursor, live until the end event, resumed after drops."""
        while True:
            try:
                with self.client.http.stream(
                    "GET", f.path, headers=f.headers(), timeout=f.timeout
                ) as response:
                    if not f.opened(self.client._read(response) if response.status_code >= 400 else response):
                        return
                    for chunk in response.iter_bytes():
                        yield from f.events(chunk)
                        if f.ended:
                            return
                    raise f.ended_early()
            except _Follow.RETRIED as exc:
                pause = f.pause(exc)
                if pause is None:
                    return
                time.sleep(pause)  # dropped: resume after the last event received

    def wait(self, timeout: float = 60.0) -> RunHead:
        return self.client._run(self._wait(timeout))

    def why_waiting(self) -> str | None:
        """Why the run is not moving, as the API says it (its view's ``waiting_for``)."""
        return self.client._run(self._view()).waiting_for

    def cancel(self) -> Phase | None:
        """Ask the run to stop; the phase it was in (an ended run raises :class:`ApiRequestError`)."""
        return self.client._run(self._cancel())

    def fork(self, *, version: int | None = None, input: str | None = None) -> ApiRunHandle:
        """A new run from checkpoint ``version`` of this one (default: the last before it ended),
        ``input`` replacing its last user message; this run is untouched."""
        return ApiRunHandle(self.client, self.client._run(self._fork(version, input)))

    def approve(self, note: str = "", *, always: bool = False) -> None:
        """``always``: the tools of these calls need no approval again for the rest of the run."""
        self.decide(Decision(approve=True, note=note, always=always))

    def deny(self, note: str = "") -> None:
        self.decide(Decision(approve=False, note=note))

    def decide(self, decision: Decision) -> None:
        self.client._run(self._decide(decision))

    def send_message(self, text: str, *, key: str | None = None) -> SignalView:
        """Send a user message into the run (its next think sees it); ``key``: idempotent."""
        return self.client._run(self._send_signal("messages", {"text": text}, key))

    def update(
        self, patch: dict[str, Any], *, key: str | None = None, wait: float | None = 30.0
    ) -> SignalView:
        """Send a state update; wait up to ``wait`` seconds (None: not at all) for its outcome."""
        return self.client._run(self._update(patch, key, wait))

    def signal(self, signal_id: int, *, wait: float = 0.0) -> SignalView:
        """What became of one signal of the run; ``wait``: seconds to wait while it is pending."""
        return self.client._run(self._signal(signal_id, wait))


# -- async -----------------------------------------------------------------------------------------


class AsyncClient(_ClientBase):
    """The HTTP API for asyncio services: the same surface as :class:`ApiClient`, awaited."""

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout: float = 30.0,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        max_event_chars: int = MAX_EVENT_CHARS,
        **httpx_options: Any,
    ) -> None:
        super().__init__(url, key, timeout, httpx_options, max_answer_bytes, max_event_chars)
        self.http = httpx.AsyncClient(**self._http_options)

    @classmethod
    def from_env(cls) -> AsyncClient:
        return cls()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _call(
        self, method: str, path: str, *, refusals: Refusals | None = None, **kwargs: Any
    ) -> httpx.Response:
        async with self.http.stream(method, path, **kwargs) as streamed:
            response = await self._read(streamed)
        _raise_for(response, refusals)
        return response

    async def _read(self, streamed: httpx.Response) -> httpx.Response:
        """A streamed answer read whole, up to ``max_answer_bytes``."""
        body = _Body(streamed, self.max_answer_bytes)
        async for chunk in streamed.aiter_bytes():
            body.add(chunk)
        return body.response()

    async def _run(self, op: _Op[_T]) -> _T:
        answer: httpx.Response | None = None
        try:
            while True:
                step = op.send(answer)
                if isinstance(step, _Request):
                    answer = await self._call(step.method, step.path, refusals=step.refusals, **step.kwargs)
                else:
                    answer = None
                    await asyncio.sleep(step)
        except StopIteration as done:
            result: _T = done.value
            return result

    async def submit(
        self,
        agent: str,
        input: str,
        *,
        thread_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        model: str | None = None,
        callback: Callback | dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        namespace: str | None = None,
        thread_policy: ThreadPolicy | None = None,
        assistant: str | None = None,
        assistant_version: int | None = None,
    ) -> AsyncRunHandle:
        op = self._submit(
            agent,
            input,
            thread_id,
            metadata,
            model,
            callback,
            idempotency_key,
            namespace,
            thread_policy,
            assistant,
            assistant_version,
        )
        return AsyncRunHandle(self, await self._run(op))

    async def submit_and_follow(
        self,
        agent: str,
        input: str,
        *,
        thread_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        model: str | None = None,
        callback: Callback | dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        namespace: str | None = None,
        thread_policy: ThreadPolicy | None = None,
        assistant: str | None = None,
        assistant_version: int | None = None,
        idle_timeout: float | None = None,
    ) -> AsyncIterator[Event]:
        """:meth:`ApiClient.submit_and_follow`: start a run and follow its events in one request."""
        body = _submit_body(
            agent,
            input,
            thread_id,
            metadata,
            model,
            callback,
            namespace,
            thread_policy,
            assistant,
            assistant_version,
        )
        timeout = httpx.Timeout(self.http.timeout.connect, read=idle_timeout)
        async with self.http.stream(
            "POST", "/v1/runs", timeout=timeout, **_followed_submit(body, idempotency_key)
        ) as r:
            if r.status_code >= 400:
                _raise_for(await self._read(r))
            streamed = _streamed_run(r)
            run_id = streamed or RunView.model_validate_json((await self._read(r)).content).run_id
            f = _Follow(run_id, "0-0", timeout.connect, idle_timeout, None, self.max_event_chars)
            if streamed is not None and f.opened(r):
                try:
                    async for chunk in r.aiter_bytes():
                        for event in f.events(chunk):
                            yield event
                        if f.ended:
                            return
                except httpx.ReadTimeout:
                    return  # idle for idle_timeout: following ends, as for a handle's events
                except _DROPPED:
                    pass  # resumed below, after the last event received
        # Resumed with the same follower: it was connected, so a server restarting is waited for.
        async for event in AsyncRunHandle(self, run_id)._follow(f):
            yield event

    def handle(self, run_id: str) -> AsyncRunHandle:
        return AsyncRunHandle(self, run_id)

    async def list_runs(
        self,
        *,
        agent: str | None = None,
        status: str | None = None,
        thread_id: str | None = None,
        since: float | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> RunList:
        return await self._run(
            self._list_runs(
                agent=agent, status=status, thread_id=thread_id, since=since, cursor=cursor, limit=limit
            )
        )

    async def list_pipelines(
        self,
        *,
        pipeline: str | None = None,
        status: str | None = None,
        since: float | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> PipelineList:
        return await self._run(
            self._list_pipelines(pipeline=pipeline, status=status, since=since, cursor=cursor, limit=limit)
        )

    async def agents(self) -> list[AgentView]:
        return await self._run(self._agents())

    async def versions(self) -> list[VersionView]:
        """Agent versions live in the pool, and how many of this tenant's runs each holds."""
        return await self._run(self._versions())

    @property
    def memory(self) -> AsyncMemory:
        """The long-term memory of the key's tenant."""
        return AsyncMemory(self)

    @property
    def assistants(self) -> AsyncAssistants:
        """The key's tenant's assistants."""
        return AsyncAssistants(self)

    @property
    def evals(self) -> AsyncEvals:
        """The key's tenant's evals."""
        return AsyncEvals(self)

    @property
    def schedules(self) -> AsyncSchedules:
        """The key's tenant's schedules (``producer/api_schedules.py``)."""
        from producer.api_schedules import AsyncSchedules

        return AsyncSchedules(self)

    async def search(
        self,
        query: SearchQuery | None = None,
        *,
        cursor: str | None = None,
        limit: int = 50,
        **filters: Any,
    ) -> RunList:
        return await self._run(self._search(query, cursor, limit, filters))

    async def bulk(
        self,
        action: str,
        query: SearchQuery | None = None,
        *,
        rate_per_s: float | None = None,
        **filters: Any,
    ) -> BulkJob:
        return await self._run(self._bulk(action, query, rate_per_s, filters))

    async def bulk_job(self, job_id: str) -> BulkJob:
        return await self._run(self._bulk_job(job_id))

    async def bulk_jobs(self, *, limit: int = 50) -> list[BulkJob]:
        return await self._run(self._bulk_jobs(limit))

    async def bulk_outcomes(self, job_id: str) -> dict[str, BulkOutcome]:
        return await self._run(self._bulk_outcomes(job_id))

    async def cancel_bulk(self, job_id: str) -> BulkJob:
        return await self._run(self._cancel_bulk(job_id))

    async def pool(self, minutes: int = 60) -> PoolView:
        """The pool as this key may see it (see ``ApiClient.pool``)."""
        return await self._run(self._pool(minutes))


class AsyncMemory(_MemoryOps):
    """:class:`ApiMemory`, awaited."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def put(
        self, namespace: Sequence[str], key: str, value: dict[str, Any], *, ttl_s: float | None = None
    ) -> Item:
        return await self._client._run(self._put(namespace, key, value, ttl_s))

    async def get(self, namespace: Sequence[str], key: str) -> Item | None:
        try:
            return await self._client._run(self._get(namespace, key))
        except _Absent:
            return None

    async def delete(self, namespace: Sequence[str], key: str) -> bool:
        return await self._client._run(self._delete(namespace, key))

    async def search(
        self,
        namespace_prefix: Sequence[str] = (),
        *,
        query: str | None = None,
        filter: dict[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        semantic: bool = False,
    ) -> SearchResult:
        return await self._client._run(self._search(namespace_prefix, query, filter, limit, offset, semantic))

    async def list_namespaces(
        self, *, prefix: Sequence[str] = (), max_depth: int | None = None, limit: int = 100, offset: int = 0
    ) -> list[tuple[str, ...]]:
        return await self._client._run(self._list_namespaces(prefix, max_depth, limit, offset))


class AsyncAssistants(_AssistantOps):
    """:class:`ApiAssistants`, awaited."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(
        self, name: str, agent: str, config: AssistantConfig | dict[str, Any]
    ) -> AssistantVersion:
        return await self._client._run(self._create(name, agent, config))

    async def update(
        self, name: str, config: AssistantConfig | dict[str, Any], *, if_version: int | None = None
    ) -> AssistantVersion:
        return await self._client._run(self._update(name, config, if_version))

    async def rollback(self, name: str, version: int, *, if_version: int | None = None) -> AssistantVersion:
        return await self._client._run(self._rollback(name, version, if_version))

    async def delete(self, name: str) -> None:
        await self._client._run(self._delete(name))

    async def get(self, name: str, *, version: int | None = None) -> AssistantVersion:
        return await self._client._run(self._get(name, version))

    async def versions(
        self, name: str, *, before: int | None = None, limit: int = 50
    ) -> list[AssistantVersion]:
        return await self._client._run(self._versions(name, before, limit))

    async def diff(self, name: str, before: int, after: int) -> list[FieldChange]:
        return await self._client._run(self._diff(name, before, after))

    async def list(self, *, after: str | None = None, limit: int = 100) -> list[AssistantSummary]:
        return await self._client._run(self._list(after, limit))


class AsyncEvals(_EvalOps):
    """:class:`ApiEvals`, awaited."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def get(self, eval_id: str) -> dict[str, Any]:
        return await self._client._run(self._get(eval_id))

    async def results(self, eval_id: str, *, format: str = "csv") -> str:
        return await self._client._run(self._results(eval_id, format))

    async def compare(self, baseline: str, candidate: str) -> dict[str, Any]:
        return await self._client._run(self._compare(baseline, candidate))

    async def annotate(
        self,
        eval_id: str,
        item: str,
        *,
        label: Literal["pass", "fail"] | None = None,
        scores: dict[str, float] | None = None,
        note: str = "",
    ) -> Annotation:
        review = AnnotationInput(label=label, scores=scores or {}, note=note)
        return await self._client._run(self._annotate(eval_id, item, review))

    async def annotations(self, eval_id: str) -> tuple[list[Annotation], list[Annotation]]:
        return await self._client._run(self._annotations(eval_id))

    async def list(self, *, limit: int = 50) -> list[dict[str, Any]]:
        return await self._client._run(self._list(limit))


class AsyncRunHandle(_RunOps):
    def __init__(self, client: AsyncClient, run_id: str) -> None:
        super().__init__(run_id)
        self.client = client

    def __repr__(self) -> str:
        return f"AsyncRunHandle({self.run_id!r})"

    async def view(self) -> RunView:
        return await self.client._run(self._view())

    async def why_waiting(self) -> str | None:
        """Why the run is not moving, as the API says it (its view's ``waiting_for``)."""
        return (await self.view()).waiting_for

    async def status(self) -> RunHead:
        return await self.client._run(self._status())

    async def checkpoints(self) -> list[RunHead]:
        """Every committed state, in version order (read a page at a time)."""
        return await self.client._run(self._checkpoints())

    async def timeline(self) -> Timeline:
        """Where the run's time went (see ``RunHandle.timeline``)."""
        return await self.client._run(self._timeline())

    async def children(self) -> list[RunView]:
        """The run's subagent runs, in the order its steps started them."""
        return await self.client._run(self._children())

    async def retry(self, *, idempotency_key: str | None = None) -> AsyncRunHandle:
        """A fresh run with this ended run's request (see ``Client.retry``)."""
        return AsyncRunHandle(self.client, await self.client._run(self._retry(idempotency_key)))

    async def events(
        self, *, after: str = "0-0", idle_timeout: float | None = None, kinds: Collection[str] | None = None
    ) -> AsyncIterator[Event]:
        """Every event after ``after``, live until the end event, resumed after a dropped stream
        (``kinds``: only those, and the end event)."""
        timeout = self.client.http.timeout.connect
        f = _Follow(self.run_id, after, timeout, idle_timeout, kinds, self.client.max_event_chars)
        async for event in self._follow(f):
            yield event

    async def _follow(self, f: _Follow) -> AsyncIterator[Event]:
        """The run's events after ``f``'s cursor, live until the end event, resumed after drops."""
        while True:
            try:
                async with self.client.http.stream(
                    "GET", f.path, headers=f.headers(), timeout=f.timeout
                ) as response:
                    answer = await self.client._read(response) if response.status_code >= 400 else response
                    if not f.opened(answer):
                        return
                    async for chunk in response.aiter_bytes():
                        for event in f.events(chunk):
                            yield event
                        if f.ended:
                            return
                    raise f.ended_early()
            except _Follow.RETRIED as exc:
                pause = f.pause(exc)
                if pause is None:
                    return
                await asyncio.sleep(pause)

    async def wait(self, timeout: float = 60.0) -> RunHead:
        return await self.client._run(self._wait(timeout))

    async def cancel(self) -> Phase | None:
        return await self.client._run(self._cancel())

    async def fork(self, *, version: int | None = None, input: str | None = None) -> AsyncRunHandle:
        return AsyncRunHandle(self.client, await self.client._run(self._fork(version, input)))

    async def approve(self, note: str = "", *, always: bool = False) -> None:
        await self.decide(Decision(approve=True, note=note, always=always))

    async def deny(self, note: str = "") -> None:
        await self.decide(Decision(approve=False, note=note))

    async def decide(self, decision: Decision) -> None:
        await self.client._run(self._decide(decision))

    async def send_message(self, text: str, *, key: str | None = None) -> SignalView:
        return await self.client._run(self._send_signal("messages", {"text": text}, key))

    async def update(
        self, patch: dict[str, Any], *, key: str | None = None, wait: float | None = 30.0
    ) -> SignalView:
        return await self.client._run(self._update(patch, key, wait))

    async def signal(self, signal_id: int, *, wait: float = 0.0) -> SignalView:
        return await self.client._run(self._signal(signal_id, wait))
