"""``/v1/schedules`` for the HTTP clients: ``ApiClient.schedules`` and ``AsyncClient.schedules``,
``client.schedules``' surface over the API (the key's tenant's schedules; the same exceptions:
``ScheduleNotFound``, ``InvalidRequest``, ``UnknownAgent``, ``UnknownPipeline``, ``NoLiveWorker``).

Each operation is written once, with its arguments, as a generator of the requests it needs
(``producer/api_client.py``'s ``_Op``); both clients' methods are made from it.
Firing ticks is not here: that is the schedulers' work, on the run state's Redis.
"""

from __future__ import annotations

import builtins
import inspect
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import httpx

from producer.api_client import Refusals, _Op, _parsed, _Request
from producer.pipelines import UnknownPipeline
from producer.schedules import ScheduleNotFound, check_until_change
from shared.schedules import (
    HISTORY_MAX,
    MissedPolicy,
    OverlapPolicy,
    Schedule,
    ScheduleTick,
    Timing,
)

if TYPE_CHECKING:
    from producer.api_client import ApiClient, AsyncClient

__all__ = ["ApiSchedules", "AsyncSchedules"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

_REFUSALS: Refusals = {
    "not_found": lambda message, _: ScheduleNotFound(message),
    "unknown_pipeline": lambda message, _: UnknownPipeline(message),
}


def _path(schedule_id: str) -> str:
    # Schedule ids are letters and digits: anything else names no schedule (and no other path).
    if not isinstance(schedule_id, str) or not schedule_id.isascii() or not schedule_id.isalnum():
        raise ScheduleNotFound(f"no schedule {str(schedule_id)[:80]!r}")
    if len(schedule_id) > 64:
        raise ScheduleNotFound(f"no schedule {schedule_id[:80]!r}")
    return f"/v1/schedules/{schedule_id}"


def _timing(timing: Timing | dict[str, Any]) -> dict[str, Any]:
    return timing.model_dump(exclude_none=True) if isinstance(timing, Timing) else dict(timing)


def _schedule(response: httpx.Response) -> Schedule:
    return Schedule.model_validate_json(response.content)


def _create(
    agent: str | None,
    input: str,
    timing: Timing | dict[str, Any],
    *,
    metadata: dict[str, Any] | None = None,
    thread_id: str | None = None,
    assistant: str | None = None,
    missed: MissedPolicy = "skip",
    catch_up: int = 1,
    overlap: OverlapPolicy = "skip",
    check_agent: bool = True,
    pipeline: str | None = None,
    until: int | None = None,
) -> _Op[Schedule]:
    body: dict[str, Any] = {"agent": agent, "input": input, "timing": _timing(timing)}
    optional = {"metadata": metadata, "thread_id": thread_id, "assistant": assistant, "pipeline": pipeline}
    body.update({name: value for name, value in optional.items() if value is not None})
    body.update(missed=missed, catch_up=catch_up, overlap=overlap, check_agent=check_agent)
    if until is not None:
        body["until"] = until
    return _parsed(_Request("POST", "/v1/schedules", {"json": body}, _REFUSALS), _schedule)


def _update(
    schedule_id: str,
    *,
    timing: Timing | dict[str, Any] | None = None,
    input: str | None = None,
    metadata: dict[str, Any] | None = None,
    missed: MissedPolicy | None = None,
    catch_up: int | None = None,
    overlap: OverlapPolicy | None = None,
    until: int | None = None,
    clear_until: bool = False,
) -> _Op[Schedule]:
    check_until_change(until, clear_until)
    changes = {
        "input": input,
        "metadata": metadata,
        "missed": missed,
        "catch_up": catch_up,
        "overlap": overlap,
    }
    body: dict[str, Any] = {name: value for name, value in changes.items() if value is not None}
    if timing is not None:
        body["timing"] = _timing(timing)
    if until is not None or clear_until:
        body["until"] = until  # null removes the end date
    return _parsed(_Request("PATCH", _path(schedule_id), {"json": body}, _REFUSALS), _schedule)


def _get(schedule_id: str) -> _Op[Schedule]:
    return _parsed(_Request("GET", _path(schedule_id), {}, _REFUSALS), _schedule)


def _list() -> _Op[builtins.list[Schedule]]:
    return _parsed(
        _Request("GET", "/v1/schedules"),
        lambda r: [Schedule.model_validate(s) for s in r.json()["schedules"]],
    )


def _pause(schedule_id: str) -> _Op[Schedule]:
    return _parsed(_Request("POST", f"{_path(schedule_id)}/pause", {}, _REFUSALS), _schedule)


def _resume(schedule_id: str) -> _Op[Schedule]:
    return _parsed(_Request("POST", f"{_path(schedule_id)}/resume", {}, _REFUSALS), _schedule)


def _delete(schedule_id: str) -> _Op[None]:
    return _parsed(_Request("DELETE", _path(schedule_id), {}, _REFUSALS), lambda _: None)


def _next_fire_times(schedule_id: str, n: int = 5) -> _Op[builtins.list[int]]:
    request = _Request("GET", f"{_path(schedule_id)}/next", {"params": {"n": n}}, _REFUSALS)
    return _parsed(request, lambda r: [int(t) for t in r.json()["next_fire_times"]])


def _runs(schedule_id: str, limit: int = HISTORY_MAX) -> _Op[builtins.list[ScheduleTick]]:
    request = _Request("GET", f"{_path(schedule_id)}/runs", {"params": {"limit": limit}}, _REFUSALS)
    return _parsed(request, lambda r: [ScheduleTick.model_validate(t) for t in r.json()["runs"]])


# -- the two clients' methods, made from the operations above ----------------------------------------


def _named_after(method: Callable[..., Any], op: Callable[..., Any]) -> None:
    """Give a made method its operation's public name and arguments, so ``help()``, editors and
    ``inspect.signature`` show ``create(agent, input, timing, *, ...)``, not ``*args, **kwargs``."""
    method.__name__ = method.__qualname__ = op.__name__.lstrip("_")
    signature = inspect.signature(op)
    self_ = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[self_, *signature.parameters.values()],
        return_annotation=inspect.Signature.empty,
    )


def _blocking(op: Callable[_P, _Op[_T]]) -> Callable[Concatenate[ApiSchedules, _P], _T]:
    def method(self: ApiSchedules, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        return self._client._run(op(*args, **kwargs))

    _named_after(method, op)
    return method


def _awaited(op: Callable[_P, _Op[_T]]) -> Callable[Concatenate[AsyncSchedules, _P], Coroutine[Any, Any, _T]]:
    async def method(self: AsyncSchedules, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        return await self._client._run(op(*args, **kwargs))

    _named_after(method, op)
    return method


class ApiSchedules:
    """The key's tenant's schedules over ``/v1/schedules``: ``create``, ``update``, ``get``,
    ``list``, ``pause``, ``resume``, ``delete``, ``next_fire_times`` and ``runs``, with the
    arguments of ``client.schedules``' methods but ``tenant``."""

    def __init__(self, client: ApiClient) -> None:
        self._client = client

    create = _blocking(_create)
    update = _blocking(_update)
    get = _blocking(_get)
    list = _blocking(_list)
    pause = _blocking(_pause)
    resume = _blocking(_resume)
    delete = _blocking(_delete)
    next_fire_times = _blocking(_next_fire_times)
    runs = _blocking(_runs)


class AsyncSchedules:
    """:class:`ApiSchedules`, awaited."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    create = _awaited(_create)
    update = _awaited(_update)
    get = _awaited(_get)
    list = _awaited(_list)
    pause = _awaited(_pause)
    resume = _awaited(_resume)
    delete = _awaited(_delete)
    next_fire_times = _awaited(_next_fire_times)
    runs = _awaited(_runs)
