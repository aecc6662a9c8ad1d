"""``/v1/schedules`` for the HTTP clients: ``ApiClient.schedules`` and ``AsyncClient.schedules``,
``client.schedules``' surface over the API (the key's tenant's schedules; the same exceptions:
``ScheduleNotFound``, ``InvalidRequest``, ``UnknownAgent``, ``UnknownPipeline``, ``NoLiveWorker``).

Each operation is written once, as the clients' shared generators (``producer/api_client.py``).
Firing ticks is not here: that is the schedulers' work, on the run state's Redis.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any

import httpx

from producer.api_client import Refusals, _Op, _parsed, _Request
from producer.pipelines import UnknownPipeline
from producer.schedules import ScheduleNotFound
from shared.errors import InvalidRequest
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


class _ScheduleOps:
    """The operations, for both clients."""

    @staticmethod
    def _create(body: dict[str, Any]) -> _Op[Schedule]:
        return _parsed(_Request("POST", "/v1/schedules", {"json": body}, _REFUSALS), _schedule)

    @staticmethod
    def _update(schedule_id: str, body: dict[str, Any]) -> _Op[Schedule]:
        return _parsed(_Request("PATCH", _path(schedule_id), {"json": body}, _REFUSALS), _schedule)

    @staticmethod
    def _get(schedule_id: str) -> _Op[Schedule]:
        return _parsed(_Request("GET", _path(schedule_id), {}, _REFUSALS), _schedule)

    @staticmethod
    def _list() -> _Op[list[Schedule]]:
        return _parsed(
            _Request("GET", "/v1/schedules"),
            lambda r: [Schedule.model_validate(s) for s in r.json()["schedules"]],
        )

    @staticmethod
    def _state(schedule_id: str, verb: str) -> _Op[Schedule]:
        return _parsed(_Request("POST", f"{_path(schedule_id)}/{verb}", {}, _REFUSALS), _schedule)

    @staticmethod
    def _delete(schedule_id: str) -> _Op[None]:
        return _parsed(_Request("DELETE", _path(schedule_id), {}, _REFUSALS), lambda _: None)

    @staticmethod
    def _next(schedule_id: str, n: int) -> _Op[list[int]]:
        request = _Request("GET", f"{_path(schedule_id)}/next", {"params": {"n": n}}, _REFUSALS)
        return _parsed(request, lambda r: [int(t) for t in r.json()["next_fire_times"]])

    @staticmethod
    def _runs(schedule_id: str, limit: int) -> _Op[list[ScheduleTick]]:
        request = _Request("GET", f"{_path(schedule_id)}/runs", {"params": {"limit": limit}}, _REFUSALS)
        return _parsed(request, lambda r: [ScheduleTick.model_validate(t) for t in r.json()["runs"]])


def _create_body(
    agent: str | None,
    input: str,
    timing: Timing | dict[str, Any],
    **fields: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"agent": agent, "input": input, "timing": _timing(timing)}
    body.update({name: value for name, value in fields.items() if value is not None})
    return body


def _update_body(timing: Timing | dict[str, Any] | None, clear_until: bool, **fields: Any) -> dict[str, Any]:
    body = {name: value for name, value in fields.items() if value is not None}
    if timing is not None:
        body["timing"] = _timing(timing)
    if clear_until:
        if "until" in body:
            raise InvalidRequest("give until or clear_until, not both")
        body["until"] = None
    return body


class ApiSchedules(_ScheduleOps):
    """The key's tenant's schedules over ``/v1/schedules``."""

    def __init__(self, client: ApiClient) -> None:
        self._client = client

    def create(
        self,
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
    ) -> Schedule:
        body = _create_body(
            agent,
            input,
            timing,
            metadata=metadata,
            thread_id=thread_id,
            assistant=assistant,
            missed=missed,
            catch_up=catch_up,
            overlap=overlap,
            check_agent=check_agent,
            pipeline=pipeline,
            until=until,
        )
        return self._client._run(self._create(body))

    def update(
        self,
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
    ) -> Schedule:
        body = _update_body(
            timing,
            clear_until,
            input=input,
            metadata=metadata,
            missed=missed,
            catch_up=catch_up,
            overlap=overlap,
            until=until,
        )
        return self._client._run(self._update(schedule_id, body))

    def get(self, schedule_id: str) -> Schedule:
        return self._client._run(self._get(schedule_id))

    def list(self) -> builtins.list[Schedule]:
        return self._client._run(self._list())

    def pause(self, schedule_id: str) -> Schedule:
        return self._client._run(self._state(schedule_id, "pause"))

    def resume(self, schedule_id: str) -> Schedule:
        return self._client._run(self._state(schedule_id, "resume"))

    def delete(self, schedule_id: str) -> None:
        self._client._run(self._delete(schedule_id))

    def next_fire_times(self, schedule_id: str, n: int = 5) -> builtins.list[int]:
        return self._client._run(self._next(schedule_id, n))

    def runs(self, schedule_id: str, limit: int = HISTORY_MAX) -> builtins.list[ScheduleTick]:
        return self._client._run(self._runs(schedule_id, limit))


class AsyncSchedules(_ScheduleOps):
    """:class:`ApiSchedules`, awaited."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(
        self,
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
    ) -> Schedule:
        body = _create_body(
            agent,
            input,
            timing,
            metadata=metadata,
            thread_id=thread_id,
            assistant=assistant,
            missed=missed,
            catch_up=catch_up,
            overlap=overlap,
            check_agent=check_agent,
            pipeline=pipeline,
            until=until,
        )
        return await self._client._run(self._create(body))

    async def update(
        self,
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
    ) -> Schedule:
        body = _update_body(
            timing,
            clear_until,
            input=input,
            metadata=metadata,
            missed=missed,
            catch_up=catch_up,
            overlap=overlap,
            until=until,
        )
        return await self._client._run(self._update(schedule_id, body))

    async def get(self, schedule_id: str) -> Schedule:
        return await self._client._run(self._get(schedule_id))

    async def list(self) -> builtins.list[Schedule]:
        return await self._client._run(self._list())

    async def pause(self, schedule_id: str) -> Schedule:
        return await self._client._run(self._state(schedule_id, "pause"))

    async def resume(self, schedule_id: str) -> Schedule:
        return await self._client._run(self._state(schedule_id, "resume"))

    async def delete(self, schedule_id: str) -> None:
        await self._client._run(self._delete(schedule_id))

    async def next_fire_times(self, schedule_id: str, n: int = 5) -> builtins.list[int]:
        return await self._client._run(self._next(schedule_id, n))

    async def runs(self, schedule_id: str, limit: int = HISTORY_MAX) -> builtins.list[ScheduleTick]:
        return await self._client._run(self._runs(schedule_id, limit))
