"""Typed run events: one discriminated union, one Redis Stream per run.

Invariants the runtime keeps (and tests check): a step's ``StepStarted`` precedes its end, and
every ``ToolDispatched`` has exactly one ``ToolCompleted`` (which carries ``ok=False`` on
failure). Events of a transition are appended in the same atomic script as its commit, so a
redelivered task can never emit them twice.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from functools import cache
from typing import Annotated, Any, Literal, Protocol, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from shared.errors import RunErrorInfo
from shared.llm.base import Usage

__all__ = [
    "ApprovalDecided",
    "AwaitingApproval",
    "CUSTOM_EVENTS",
    "Completed",
    "CustomEvent",
    "CustomEventsDropped",
    "CustomEventsVoided",
    "END_EVENTS",
    "EVENTS_PAGE",
    "EVENT_ADAPTER",
    "EVENT_KINDS",
    "Event",
    "EventLog",
    "LIVE_EVENTS",
    "Failed",
    "HandedOff",
    "Interrupted",
    "ModelResponded",
    "RunStarted",
    "SignalApplied",
    "SignalReceived",
    "StepFailed",
    "StepStarted",
    "TokenDelta",
    "ToolCompleted",
    "ToolDispatched",
    "VersionUpgraded",
    "WorkerId",
    "configure_worker_identity",
    "dump_event",
    "follow_events",
    "load_event",
    "read_all_events",
    "stream_after",
    "this_worker",
    "worker_identity",
]


class WorkerId(BaseModel):
    """The process that produced an event: the worker's name (its host by default) and pid."""

    # Frozen: one instance names every event of the process (:func:`this_worker`).
    model_config = ConfigDict(frozen=True)

    host: str
    pid: int


_identity: str | None = None


def configure_worker_identity(name: str) -> None:
    """Name this process's events and claims (``Settings.worker_name``; empty: the host name)."""
    global _identity
    _identity = name or None


@cache
def _hostname() -> str:
    return socket.gethostname()


def worker_identity() -> str:
    return _identity or _hostname()


_this_worker: WorkerId | None = None


def this_worker() -> WorkerId:
    # Built once per process and name; pid is read each time: prefork children inherit the
    # parent's memory after fork.
    global _this_worker
    me, host, pid = _this_worker, worker_identity(), os.getpid()
    if me is None or me.pid != pid or me.host != host:
        me = _this_worker = WorkerId(host=host, pid=pid)
    return me


class _Event(BaseModel):
    run_id: str
    step: int
    ts: float = Field(default_factory=time.time)
    worker: WorkerId = Field(default_factory=this_worker)
    #: The event's id in the run's stream, set when it is read (resume after it with ``after``);
    #: not part of the stored event.
    stream_id: str | None = Field(default=None, exclude=True)


class RunStarted(_Event):
    """The start phase filled the run in from its agent."""

    kind: Literal["RunStarted"] = "RunStarted"
    agent: str
    agent_version: str
    model: str


class StepStarted(_Event):
    """A step begins: the model is about to be asked."""

    kind: Literal["StepStarted"] = "StepStarted"


class TokenDelta(_Event):
    """Text the model streamed (live, not committed: may repeat after a crash)."""

    kind: Literal["TokenDelta"] = "TokenDelta"
    text: str


class ModelResponded(_Event):
    """The model's answer for the step was accepted."""

    kind: Literal["ModelResponded"] = "ModelResponded"
    text: str | None = None
    tool_calls: int = 0
    usage: Usage = Field(default_factory=Usage)
    #: The provider cut the answer at its output token limit (``ModelResponse.truncated``).
    truncated: bool = False


class ToolDispatched(_Event):
    """A tool call was sent to the tools (exactly one completion follows)."""

    kind: Literal["ToolDispatched"] = "ToolDispatched"
    call_id: str
    tool: str
    arguments: dict[str, Any]
    #: A subagent call's child run (its own events are under that id).
    child_run_id: str | None = None


class ToolCompleted(_Event):
    """A tool call's one recorded outcome (``ok=False`` with an error on failure)."""

    kind: Literal["ToolCompleted"] = "ToolCompleted"
    call_id: str
    tool: str
    ok: bool
    output: str
    error: RunErrorInfo | None = None
    duration_s: float = 0.0
    #: Claims of this call, this one included (above 1: an earlier delivery of the call died).
    attempt: int = 1
    #: A subagent call's child run, whose end this is.
    child_run_id: str | None = None


class CustomEvent(_Event):
    """What a tool reported while it ran (``ctx.emit(name, data)``): appended at once, not with a
    commit, tagged with the call and the delivery (``attempt``) that emitted it.

    It is void when a later ``CustomEventsVoided`` of the same call names an ``attempt`` at or
    above this one: that delivery was fenced off, and its result is not the call's.
    """

    kind: Literal["CustomEvent"] = "CustomEvent"
    call_id: str
    tool: str
    #: The claim of the call that emitted it, as counted for ``ToolCompleted.attempt``.
    attempt: int
    #: The tool's own short identifier for what it reports ("progress", "partial", ...).
    name: str
    #: The tool's JSON value (bounded: ``Limits.max_custom_event_bytes``).
    data: Any = None


class CustomEventsDropped(_Event):
    """A delivery of a call emitted more custom events than its bounds allow: this many were not
    appended (written once, when the tool returns)."""

    kind: Literal["CustomEventsDropped"] = "CustomEventsDropped"
    call_id: str
    tool: str
    attempt: int
    dropped: int


class CustomEventsVoided(_Event):
    """Every ``CustomEvent`` (and ``CustomEventsDropped``) of this call with an ``attempt`` at or
    below ``attempt`` is void: those deliveries were fenced off and their results are not the
    call's. Appended when another delivery takes the call over (``taken_over``) or when a
    delivery's result is refused because the call already had one (``result_refused``)."""

    kind: Literal["CustomEventsVoided"] = "CustomEventsVoided"
    call_id: str
    tool: str
    attempt: int
    reason: Literal["taken_over", "result_refused"]


class StepFailed(_Event):
    """Something went wrong in a step, and what the policy decided."""

    kind: Literal["StepFailed"] = "StepFailed"
    error: RunErrorInfo
    #: What the policy decided: "fail", "retry", "reprompt", "interrupt", "continue".
    decision: str


class AwaitingApproval(_Event):
    """The run parked: a human must decide on this call."""

    kind: Literal["AwaitingApproval"] = "AwaitingApproval"
    call_id: str
    tool: str
    reason: str


class ApprovalDecided(_Event):
    """A human approved or denied what the run waited on, with their note and who they were."""

    kind: Literal["ApprovalDecided"] = "ApprovalDecided"
    approve: bool
    note: str = ""
    by: str = ""
    always: bool = False


class HandedOff(_Event):
    """The conversation was handed to another agent (``shared/handoffs.py``): the run goes on under
    ``to_agent`` (at ``to_version``) from the next step. Committed with the handoff, once."""

    kind: Literal["HandedOff"] = "HandedOff"
    from_agent: str
    to_agent: str
    to_version: str
    call_id: str
    #: The history the target sees: "kept" as it was, or "filtered" by the handoff's input filter.
    history: str = "kept"


class Completed(_Event):
    """The run ended with an answer."""

    kind: Literal["Completed"] = "Completed"
    answer: str
    usage: Usage = Field(default_factory=Usage)
    #: The answer was cut at the model's output token limit and accepted so (``Policy.on_truncated``).
    truncated: bool = False
    #: The structured output (an agent with an ``output_type``), as JSON.
    output: Any = None


class Failed(_Event):
    """The run ended with an error."""

    kind: Literal["Failed"] = "Failed"
    error: RunErrorInfo


class VersionUpgraded(_Event):
    """The run moved forward to a newer version of its agent's code (``shared/versions.py``): the
    author declared the old version compatible, or gave a migration of its state."""

    kind: Literal["VersionUpgraded"] = "VersionUpgraded"
    agent: str
    from_version: str
    to_version: str
    #: ``compatible`` (served as it was) or ``migrated`` (its state mapped by the migration).
    how: str


class Interrupted(_Event):
    """The run was cancelled, or halted by its policy."""

    kind: Literal["Interrupted"] = "Interrupted"
    reason: str


class SignalReceived(_Event):
    """A message or a state update was sent into the run and is pending (``shared/signals.py``).

    Appended by the script that takes the signal, so it is in the stream exactly when the signal is
    in the inbox. ``step`` is 0: a signal belongs to no step until it is applied.
    """

    kind: Literal["SignalReceived"] = "SignalReceived"
    seq: int
    signal: Literal["message", "update"]
    by: str = ""


class SignalApplied(_Event):
    """A signal was applied by the commit this event belongs to: accepted, or (an update that does
    not fit the run's state type) rejected with the error."""

    kind: Literal["SignalApplied"] = "SignalApplied"
    seq: int
    signal: Literal["message", "update"]
    accepted: bool
    error: str | None = None


Event = Annotated[
    RunStarted
    | StepStarted
    | TokenDelta
    | ModelResponded
    | ToolDispatched
    | ToolCompleted
    | CustomEvent
    | CustomEventsDropped
    | CustomEventsVoided
    | StepFailed
    | AwaitingApproval
    | ApprovalDecided
    | HandedOff
    | Completed
    | Failed
    | Interrupted
    | VersionUpgraded
    | SignalReceived
    | SignalApplied,
    Field(discriminator="kind"),
]
EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
#: Every event kind, in the union's order.
EVENT_KINDS: tuple[str, ...] = tuple(t.model_fields["kind"].default for t in get_args(get_args(Event)[0]))

END_EVENTS = ("Completed", "Failed", "Interrupted")
#: The events a tool's ``ctx.emit`` leads to: live, outside commits (``shared/custom_events.py``).
CUSTOM_EVENTS = ("CustomEvent", "CustomEventsDropped", "CustomEventsVoided")
#: The events appended outside commits (may repeat after a crash); every other kind is committed.
LIVE_EVENTS = ("TokenDelta", *CUSTOM_EVENTS)


def dump_event(event: Event) -> str:
    return event.model_dump_json()


def load_event(raw: str | bytes) -> Event:
    return EVENT_ADAPTER.validate_json(raw)


# -- reading a run's events ------------------------------------------------------------------------

#: Events read per round trip when reading a run's events whole.
EVENTS_PAGE = 500
#: How long one blocking read waits for new events while following.
_WAIT_S = 0.5


def stream_after(after: str) -> str:
    """The ``XRANGE`` lower bound for the entries after stream id ``after`` (``0-0``: all)."""
    return f"({after}" if after != "0-0" else "-"


class _Head(Protocol):
    @property
    def terminal(self) -> bool: ...


class EventLog(Protocol):
    """Where a run's events are read (``RunStore``): a page after an id, Redis first and the
    archive once Redis has none; a blocking wait for new ones; the run's head."""

    def read_events(self, run_id: str, after: str = ..., count: int = ...) -> list[tuple[str, Event]]: ...

    def wait_events(self, run_id: str, after: str, timeout_s: float) -> list[tuple[str, Event]]: ...

    def load(self, run_id: str) -> _Head | None: ...


def read_all_events(
    log: EventLog, run_id: str, after: str = "0-0", page: int = EVENTS_PAGE
) -> Iterator[tuple[str, Event]]:
    """Every stored event of the run after ``after``, with its stream id, a page at a time."""
    while True:
        batch = log.read_events(run_id, after=after, count=page)
        yield from batch
        if len(batch) < page:
            return
        after = batch[-1][0]  # a full page: there may be more


def follow_events(
    log: EventLog, run_id: str, after: str = "0-0", idle_timeout: float | None = None
) -> Iterator[tuple[str, Event]]:
    """The run's events after ``after``, live until its end event (``idle_timeout``: or until
    nothing arrived for that long), each with its stream id."""
    cursor = after
    idle_since = time.monotonic()
    while True:
        batch = log.read_events(run_id, after=cursor, count=EVENTS_PAGE)
        if not batch:
            batch = log.wait_events(run_id, after=cursor, timeout_s=_WAIT_S)
        for event_id, event in batch:
            cursor = event_id
            yield event_id, event
            if event.kind in END_EVENTS:
                return
        if batch:
            idle_since = time.monotonic()
            continue
        # Nothing new: the end event is committed atomically with the terminal head, so a
        # terminal run with nothing left to read has had its stream trimmed or expired.
        head = log.load(run_id)
        if head is None or head.terminal:
            yield from log.read_events(run_id, after=cursor)
            return
        if idle_timeout is not None and time.monotonic() - idle_since > idle_timeout:
            return
