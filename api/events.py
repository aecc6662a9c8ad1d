"""``GET /v1/runs/{id}/events``: a run's events, as Server-Sent Events or as JSON pages.

A stream sends each event with its Redis stream id as the SSE ``id``, so a client that lost its
connection resumes with ``Last-Event-ID`` (browsers do this by themselves) and gets every later
event once: the id is the event's position in the run's stream, not a count kept by this process.
The stream ends after the run's end event (Completed, Failed or Interrupted); a resume after that
end is answered ``204 No Content``, which tells a browser's ``EventSource`` to stop reconnecting.
While nothing happens a keep-alive comment is sent every ``keepalive_s``.

All the streams of one run in one process share a single reader (:mod:`api.feeds`): one
``XREAD BLOCK`` on one Redis connection, its batches handed to every follower's bounded queue. A
process serves at most ``max_streams`` streams (503 past that).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from api.errors import ApiError
from api.feeds import BATCH
from api.models import EventPage
from api.runs import ERRORS, Svc, Who, owned_run
from api.services import Services
from shared import protocol
from shared.events import END_EVENTS
from shared.state import Phase

__all__ = ["events", "router", "sse_frame"]

router = APIRouter(prefix="/v1", responses=ERRORS)

_STREAM_ID = re.compile(r"^\d{1,20}-\d{1,20}$")


def sse_frame(event_id: str, raw: str) -> str:
    """One event as an SSE message: its stream id as ``id``, the event's JSON (with ``id``) as data."""
    return f'id: {event_id}\ndata: {{"id":"{event_id}",{raw[1:]}\n\n'


def _cursor(value: str | None) -> str:
    if value is None or value == "":
        return "0-0"
    if not _STREAM_ID.match(value):
        raise ApiError(422, "invalid_request", f"an event id looks like 1700000000000-0, got {value[:40]!r}")
    return value


@router.get(
    "/runs/{run_id}/events",
    response_model=EventPage,
    summary="A run's events: a live Server-Sent Events stream, or a JSON page",
    description="With ``Accept: text/event-stream``: every event after ``Last-Event-ID`` (or"
    " ``after``), live until the run's end event, then the stream closes. Otherwise a JSON page of"
    " at most ``limit`` events after ``after``.",
    responses={
        200: {
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "description": "A JSON page, or an event stream.",
        },
        204: {"description": "Streaming was asked to resume after the run's end event: nothing more."},
    },
)
async def events(
    run_id: str,
    request: Request,
    services: Svc,
    who: Who,
    after: Annotated[str | None, Query(max_length=45, description="Events after this id.")] = None,
    limit: Annotated[int, Query(ge=1, le=BATCH)] = 200,
    last_event_id: Annotated[str | None, Header(max_length=45)] = None,
) -> Response:
    head = await run_in_threadpool(owned_run, services, who, run_id)
    if "text/event-stream" not in request.headers.get("accept", ""):
        cursor = _cursor(after)
        batch = await run_in_threadpool(services.store.read_events, run_id, cursor, limit)
        ended = any(e.kind in END_EVENTS for _, e in batch) or (len(batch) < limit and head.terminal)
        page = EventPage(
            events=[{"id": eid, **e.model_dump(mode="json")} for eid, e in batch],
            next_after=batch[-1][0] if batch else cursor,
            ended=ended,
        )
        return Response(page.model_dump_json(), media_type="application/json")
    cursor = _cursor(last_event_id if last_event_id is not None else after)
    if head.terminal and not await services.aredis.xrange(
        services.keys.events(run_id), min=f"({cursor}" if cursor != "0-0" else "-", count=1
    ):
        return Response(status_code=204)
    if services.open_streams >= services.config.max_streams:
        raise ApiError(
            503,
            "unavailable",
            f"this API process already serves {services.config.max_streams} event streams",
            headers={"Retry-After": "5"},
        )
    return StreamingResponse(
        _stream(services, run_id, cursor),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _stream(services: Services, run_id: str, cursor: str) -> AsyncIterator[str]:
    services.open_streams += 1
    try:
        # A browser waits this long before it reconnects (with Last-Event-ID) after a drop.
        yield "retry: 1000\n\n"
        async for batch in services.feeds.follow(
            services.keys.events(run_id), cursor, services.config.keepalive_s
        ):
            if batch is not None:
                for event_id, raw in batch:
                    yield sse_frame(event_id, raw)
                    if json.loads(raw).get("kind") in END_EVENTS:
                        return
                continue
            # Nothing for a while. The end event is committed with the terminal phase, so a run
            # that ended (or is gone) with nothing left to read had its events trimmed: stop.
            phase = await services.aredis.hget(services.keys.run(run_id), protocol.PHASE)
            if phase is None or Phase(str(phase)).terminal:
                return
            yield ": keep-alive\n\n"
    finally:
        services.open_streams -= 1
