"""``GET /v1/runs/{id}/events``: a run's events, as Server-Sent Events or as JSON pages.

A stream sends each event with its Redis stream id as the SSE ``id``, so a client that lost its
connection resumes with ``Last-Event-ID`` (browsers do this by themselves) and gets every later
event once: the id is the event's position in the run's stream, not a count kept by this process.
The stream ends after the run's end event (Completed, Failed or Interrupted); a resume after that
end is answered ``204 No Content``, which tells a browser's ``EventSource`` to stop reconnecting.
An ended run's events are read where they are: from the archive once the run has moved there, a
page at a time; if the archive fails between pages the stream ends early, cleanly, and the resume
after its last event is answered 503 until the archive can be read again.
While nothing happens a keep-alive comment is sent every ``keepalive_s``.

All the streams of one run in one process share a single reader (:mod:`producer.api.feeds`): one
``XREAD BLOCK`` on one Redis connection, its batches handed to every follower's bounded queue. A
process serves at most ``max_streams`` streams (503 past that), and at most ``streams_per_tenant``
of one tenant (429 ``too_many_streams`` past that: its own limit), so one tenant holding streams
open without reading them cannot take every stream of the process from the others. A stream's
place is taken before its answer starts and given back when the answer ends, however it ends
(run ended, client gone, reader failed).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from producer.api.errors import ApiError
from producer.api.feeds import BATCH, Entry
from producer.api.feeds import after as comes_after
from producer.api.limits import StreamSlot
from producer.api.models import EventPage
from producer.api.runs import ERRORS, Svc, Who, check_run_id, owned, owned_run
from producer.api.services import Services
from shared import protocol
from shared.errors import ArchiveUnavailable
from shared.events import END_EVENTS, EVENT_KINDS, Event, dump_event, stream_after
from shared.state import Phase, RunHead
from shared.store.runs import loaded_head

__all__ = [
    "FUTURE_ID_SLACK_MS",
    "event_cursor",
    "events",
    "follow_answer",
    "router",
    "submitted_answer",
    "wants_stream",
]

router = APIRouter(prefix="/v1", responses=ERRORS)
log = logging.getLogger("wesichain.api")

_STREAM_ID = re.compile(r"^\d{1,20}-\d{1,20}$")

#: How far past the clock an event id a client sends may be before it is refused as naming no
#: event (:func:`_not_in_the_future`). An id is its event's time by Redis's clock; this leaves room
#: for the clocks of a promoted replica and the primary it replaced to differ.
FUTURE_ID_SLACK_MS = 60_000


def _kinds(value: str | None) -> frozenset[str] | None:
    """The kinds asked for (``kinds=CustomEvent,ToolCompleted``); None: every kind."""
    if value is None or value == "":
        return None
    asked = frozenset(k.strip() for k in value.split(",") if k.strip())
    if not asked:
        raise ApiError(422, "invalid_request", "kinds names no event kind: leave it out for every kind")
    unknown = sorted(asked - set(EVENT_KINDS))
    if unknown:
        raise ApiError(
            422,
            "invalid_request",
            f"kinds: {unknown[0][:40]!r} is not an event kind (one of {', '.join(EVENT_KINDS)})",
        )
    return asked


def _wanted(kinds: frozenset[str] | None, kind: str | None) -> bool:
    """Whether an event of ``kind`` is sent: every kind asked for, and always the end event, which
    says the stream is over."""
    return kinds is None or kind in kinds or kind in END_EVENTS


def wants_stream(accept: str) -> bool:
    """Whether an ``Accept`` header asks for an event stream: ``text/event-stream`` among its media
    ranges, in any case (RFC 9110 §8.3.1), and not refused with ``q=0``."""
    for media_range in accept.split(","):
        media_type, *params = (part.strip().lower() for part in media_range.split(";"))
        if media_type != "text/event-stream":
            continue
        weights = [v.strip() for name, _, v in (p.partition("=") for p in params) if name.strip() == "q"]
        try:
            if not weights or float(weights[0]) > 0:
                return True
        except ValueError:
            return True  # a weight that is no number: the type is still asked for
    return False


def event_cursor(value: str | None) -> str:
    """An event id a client sent (``after``, ``Last-Event-ID``) as a stream cursor; 422 unless it is
    one Redis reads."""
    if value is None or value == "":
        return "0-0"
    if not _STREAM_ID.match(value) or max(int(part) for part in value.split("-")) >= 2**64 - 1:
        # Redis's stream ids are two unsigned 64-bit numbers: a larger one it refuses outright, and
        # the largest, as the id to read after, leaves no id after it (Redis refuses that too).
        raise ApiError(422, "invalid_request", f"an event id looks like 1700000000000-0, got {value[:40]!r}")
    return value


async def _not_in_the_future(services: Services, run_id: str, cursor: str) -> None:
    """A 422 for an event id later than the clock (and than the run's last event): no event has it,
    and none will for as long as that is ahead, so a stream resumed after it would send nothing, only
    keep-alives, until the run ended, and then end without the end event. (A made-up id, or one
    read wrong.) Checked on this process's clock first, so a usual resume costs no round trip; an
    id past it is refused only if it is past Redis's clock too, which gave the ids."""
    ms = int(cursor.partition("-")[0])
    if ms <= time.time() * 1000 + FUTURE_ID_SLACK_MS:
        return
    seconds, micros = await services.aredis.time()
    if ms <= seconds * 1000 + micros // 1000 + FUTURE_ID_SLACK_MS:
        return
    # Redis's ids follow its clock, or its stream's last id while its clock is behind that.
    latest = await services.aredis.xrevrange(services.keys.events(run_id), count=1)
    if latest and not comes_after(cursor, str(latest[0][0])):
        return
    raise ApiError(
        422,
        "invalid_request",
        f"event id {cursor} is later than the server's clock: no event of run {run_id} has it",
        details={"event_id": cursor},
    )


@router.get(
    "/runs/{run_id}/events",
    response_model=EventPage,
    summary="A run's events: a live Server-Sent Events stream, or a JSON page",
    description="With ``Accept: text/event-stream``: every event after ``Last-Event-ID`` (or"
    " ``after``), live until the run's end event, then the stream closes. Otherwise a JSON page of"
    " at most ``limit`` events after ``after``. An event id later than the server's clock names no"
    " event: 422.",
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
    kinds: Annotated[
        str | None,
        Query(
            max_length=400,
            description="Only events of these kinds, comma-separated (e.g. ``CustomEvent``); the run's"
            " end event is always sent.",
        ),
    ] = None,
) -> Response:
    head = await _owned_run(services, who, run_id)
    only = _kinds(kinds)
    if not wants_stream(request.headers.get("accept", "")):
        cursor = event_cursor(after)
        await _not_in_the_future(services, run_id, cursor)
        batch = await run_in_threadpool(services.store.read_events, run_id, cursor, limit)
        ended = any(e.kind in END_EVENTS for _, e in batch) or (len(batch) < limit and head.terminal)
        page = EventPage(
            events=[{"id": eid, **e.model_dump(mode="json")} for eid, e in batch if _wanted(only, e.kind)],
            next_after=batch[-1][0] if batch else cursor,
            ended=ended,
        )
        return Response(page.model_dump_json(), media_type="application/json")
    cursor = event_cursor(last_event_id if last_event_id is not None else after)
    await _not_in_the_future(services, run_id, cursor)
    body: AsyncIterator[str] | None = None
    if head.terminal and (rest := await _ended_rest(services, run_id, cursor)) is not None:
        if not rest:
            return Response(status_code=204)
        body = _archived(services, run_id, rest, only)
    # Taken here, with no await between the check and the count, so a burst of requests cannot
    # all pass the check before any of them is counted.
    slot = services.streams.take(who.tenant)
    return follow_answer(services, run_id, cursor, slot, only, body)


def follow_answer(
    services: Services,
    run_id: str,
    cursor: str,
    slot: StreamSlot,
    only: frozenset[str] | None = None,
    body: AsyncIterator[str] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """A run's events after ``cursor`` as an SSE answer, live until its end event (``body``: the
    events of an ended run, read elsewhere), holding ``slot`` until it ends. Also the answer of a
    submit that asks for an event stream (``POST /v1/runs`` with ``Accept: text/event-stream``)."""
    return _SlotStream(
        slot,
        _stream(services, run_id, cursor, slot, only) if body is None else body,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
    )


async def submitted_answer(
    services: Services, run_id: str, ended: bool, slot: StreamSlot, headers: dict[str, str]
) -> Response:
    """The answer of a submit that asks for an event stream: the run's events from its first, as
    :func:`follow_answer` sends them. ``ended``: the run had ended already (an idempotent submit
    sent again), its events read where they are, the archive once the run has moved there."""
    body = None
    if ended and (rest := await _ended_rest(services, run_id, "0-0")) is not None:
        body = _archived(services, run_id, rest, None)
    return follow_answer(services, run_id, "0-0", slot, body=body, headers=headers)


async def _ended_rest(services: Services, run_id: str, cursor: str) -> list[tuple[str, Event]] | None:
    """The first events after ``cursor`` of an ended run that has none after it in Redis: an ended
    run's events move to the archive with it, and a client may ask for them after that (resuming
    a stream lost mid-run, or sending its submit again). None: Redis holds events after it."""
    if await services.aredis.xrange(services.keys.events(run_id), min=stream_after(cursor), count=1):
        return None
    return await run_in_threadpool(services.store.read_events, run_id, cursor, BATCH)


async def _owned_run(services: Services, who: Who, run_id: str) -> RunHead:
    """:func:`owned_run`, read on the event loop's own Redis client while the run is in Redis (a
    stream's usual case): no hop to a worker thread and back before the stream starts."""
    check_run_id(run_id)
    fields = [protocol.BODY, protocol.REQUEST, protocol.EPOCH]
    head = loaded_head(await services.aredis.hmget(services.keys.run(run_id), fields))
    if head is None:  # ended and archived, or no such run: the archive is read blocking
        return await run_in_threadpool(owned_run, services, who, run_id)
    return owned(who, run_id, head)


class _SlotStream(StreamingResponse):
    """A stream answer that gives its slot back when it ends, also one whose body never started
    (the client went away first): the body's own ``finally`` would not run then."""

    def __init__(
        self, slot: StreamSlot, content: AsyncIterator[str], media_type: str, headers: dict[str, str]
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self.slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()


async def _archived(
    services: Services, run_id: str, batch: list[tuple[str, Event]], only: frozenset[str] | None
) -> AsyncIterator[str]:
    """The stream of an ended run's events after a cursor, read where they are (the archive, once
    the run moved there), a page at a time, until its end event. (Its slot is given back by the
    answer, :class:`_SlotStream`.)"""
    yield "retry: 1000\n\n"
    while batch:
        chunk, ended = _chunk([Entry(event_id, dump_event(event)) for event_id, event in batch], only)
        if chunk:
            yield chunk
        if ended or len(batch) < BATCH:
            return
        try:
            batch = await run_in_threadpool(services.store.read_events, run_id, batch[-1][0], BATCH)
        except ArchiveUnavailable as exc:
            # The answer has started: no 503 can be sent now. Ended here, the stream closes cleanly
            # after whole events, each with its id, and the client resumes after the last one it
            # got (a browser by itself, after the retry above), answered 503 until the archive is
            # back; failing the answer instead would cut it mid-chunk and log a traceback.
            log.warning("the archived events of run %s stopped after %s: %s", run_id, batch[-1][0], exc)
            return


def _chunk(batch: list[Entry], only: frozenset[str] | None) -> tuple[str, bool]:
    """A batch of a run's events as one write of SSE frames (each event's frame rendered once, for
    every follower of a feed): those of the kinds asked for, up to the run's end event; and whether
    that end event was among them (the stream ends with it)."""
    frames = []
    for entry in batch:
        kind = entry.kind
        if _wanted(only, kind):
            frames.append(entry.frame)
        if kind in END_EVENTS:
            return "".join(frames), True
    return "".join(frames), False


async def _stream(
    services: Services, run_id: str, cursor: str, slot: StreamSlot, only: frozenset[str] | None = None
) -> AsyncIterator[str]:
    try:
        # A browser waits this long before it reconnects (with Last-Event-ID) after a drop.
        yield "retry: 1000\n\n"
        async for batch in services.feeds.follow(
            services.keys.events(run_id), cursor, services.config.keepalive_s
        ):
            if batch is not None:
                chunk, ended = _chunk(batch, only)
                if chunk:
                    yield chunk
                if ended:
                    return
                continue
            # Nothing for a while. The end event is committed with the terminal phase, so a run
            # that ended (or is gone) with nothing left to read had its events trimmed: stop.
            phase = await services.aredis.hget(services.keys.run(run_id), protocol.PHASE)
            if phase is None or Phase(str(phase)).terminal:
                return
            yield ": keep-alive\n\n"
    finally:
        slot.release()
