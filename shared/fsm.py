"""The run state machine as types: each phase is its own class exposing only its legal moves.

    IDLE ─start→ THINKING ─complete→ COMPLETED
                    │ └─act→ ACTING ─observe→ OBSERVING ─next_step→ THINKING …
                    │                                   └─finish→ COMPLETED (a tool ended the run)
                    ├─reprompt / retry / absorb (signals)→ THINKING
                    ├─hand_off / refuse_handoff→ THINKING (the next step; under the target agent)
                    ├─park→ AWAITING_APPROVAL ─approve→ ACTING, ─deny→ THINKING
                    └─delegate→ AWAITING_APPROVAL (subagents) ─resume→ THINKING
    OBSERVING ─park_unknown→ AWAITING_APPROVAL ─resume→ THINKING
    any live phase ─fail→ FAILED, ─interrupt→ INTERRUPTED

The view classes are named after the phases; the parked and terminal ones are ``Parked``,
``CompletedRun``, ``FailedRun`` and ``InterruptedRun`` (the events that announce those moves are
``AwaitingApproval``, ``Completed``, ``Failed`` and ``Interrupted``).

Calling ``.act()`` on an :class:`Acting` or anything on a :class:`CompletedRun` is a type error
(``tests/unit/test_typestate.py`` proves mypy rejects it). At runtime, :func:`view` is the only
way in, and it checks the stored phase. Transitions are pure: they return the new head, the
messages to append and the events to emit; the worker commits them atomically.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from shared import events as ev
from shared.errors import InternalInvariant, RunErrorInfo
from shared.llm.base import Usage
from shared.messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolMessage, UserMessage
from shared.state import Approval, ChildRun, HandoffRecord, Phase, RunHead, Summary, ToolResult

__all__ = [
    "Acting",
    "AnyPhase",
    "CompletedRun",
    "FailedRun",
    "Idle",
    "InterruptedRun",
    "LivePhase",
    "Observing",
    "Parked",
    "PhaseView",
    "Thinking",
    "Transition",
    "view",
    "view_as",
]

P = TypeVar("P", bound="PhaseView", covariant=True)


@dataclass(frozen=True)
class Transition(Generic[P]):
    """One move of the state machine: the new view, the messages to append, the events to emit."""

    to: P
    messages: tuple[Message, ...] = ()
    events: tuple[ev.Event, ...] = ()

    @property
    def head(self) -> RunHead:
        return self.to.head


@dataclass(frozen=True)
class PhaseView:
    """A run's head seen in one phase; subclasses expose only that phase's legal moves."""

    head: RunHead
    phase: Phase = field(init=False, default=Phase.IDLE)

    def _next(self, phase: Phase, **changes: Any) -> RunHead:
        now = time.time()
        # ``ran`` names the delivery that commits a version: the committing worker stamps it.
        update = {"phase": phase, "version": self.head.version + 1, "updated_at": now, "ran": None}
        return self.head.model_copy(update={**update, **changes})


@dataclass(frozen=True)
class _Live(PhaseView):
    """A phase that can still end: by failure or by interruption (cancel, or halted by policy)."""

    def fail(self, error: RunErrorInfo) -> Transition[FailedRun]:
        head = self._next(Phase.FAILED, error=error, pending_calls=[], done_calls=[], waiting_calls=[])
        return Transition(
            FailedRun(head), events=(ev.Failed(run_id=head.run_id, step=head.step, error=error),)
        )

    def interrupt(self, reason: str, error: RunErrorInfo | None = None) -> Transition[InterruptedRun]:
        head = self._next(Phase.INTERRUPTED, error=error, pending_calls=[], done_calls=[], waiting_calls=[])
        return Transition(
            InterruptedRun(head), events=(ev.Interrupted(run_id=head.run_id, step=head.step, reason=reason),)
        )

    @property
    def budget_left(self) -> int:
        return self.head.max_steps - self.head.steps_used


@dataclass(frozen=True)
class Idle(_Live):
    """Created, waiting for its start phase."""

    phase: Phase = field(init=False, default=Phase.IDLE)

    def start(
        self,
        initial: Sequence[Message],
        *,
        agent_version: str,
        model: str,
        max_steps: int,
        state: dict[str, Any] | None = None,
        handoffs: Sequence[HandoffRecord] = (),
    ) -> Transition[Thinking]:
        """Start thinking from ``initial``; ``handoffs``: those a fork of a handed-off run keeps
        (``shared/timetravel.py``), under whose last target it goes on."""
        head = self._next(
            Phase.THINKING,
            step=1,
            steps_used=1,
            message_count=len(initial),
            agent_version=agent_version,
            model=model,
            max_steps=max_steps,
            state=state,
            handoffs=list(handoffs),
        )
        return Transition(
            Thinking(head),
            messages=tuple(initial),
            events=(
                ev.RunStarted(
                    run_id=head.run_id,
                    step=0,
                    agent=head.agent,
                    agent_version=head.agent_version,
                    model=head.model,
                ),
                ev.StepStarted(run_id=head.run_id, step=1),
            ),
        )


@dataclass(frozen=True)
class Thinking(_Live):
    """Waiting for (or asking) the model."""

    phase: Phase = field(init=False, default=Phase.THINKING)

    def complete(
        self, answer: str, usage: Usage, output: Any = None, truncated: bool = False
    ) -> Transition[CompletedRun]:
        """The model's final answer (and its structured ``output``, validated) ends the run;
        ``truncated``: the provider cut it at its output limit, and the policy accepted it so."""
        total = self.head.usage + usage
        head = self._next(
            Phase.COMPLETED,
            answer=answer,
            truncated=truncated,
            output=output,
            usage=total,
            message_count=self.head.message_count + 1,
            model_retries=0,
        )
        return Transition(
            CompletedRun(head),
            messages=(AssistantMessage(content=answer),),
            events=(
                ev.ModelResponded(
                    run_id=head.run_id, step=head.step, text=answer, usage=usage, truncated=truncated
                ),
                ev.Completed(
                    run_id=head.run_id,
                    step=head.step,
                    answer=answer,
                    usage=total,
                    output=output,
                    truncated=truncated,
                ),
            ),
        )

    def act(
        self, text: str | None, calls: Sequence[ToolCall], usage: Usage, cap: int | None = None
    ) -> Transition[Acting]:
        """Send the calls to the tools (``cap``: at most that many at once, the rest in later waves)."""
        if not calls:
            raise InternalInvariant("act() needs at least one tool call", step=self.head.step)
        wave, waiting = _wave(calls, cap)
        head = self._next(
            Phase.ACTING,
            pending_calls=wave,
            done_calls=[],
            waiting_calls=waiting,
            usage=self.head.usage + usage,
            message_count=self.head.message_count + 1,
            model_retries=0,
        )
        responded = ev.ModelResponded(
            run_id=head.run_id, step=head.step, text=text, tool_calls=len(calls), usage=usage
        )
        return Transition(
            Acting(head),
            messages=(AssistantMessage(content=text, tool_calls=list(calls)),),
            events=(responded, *_dispatched(head)),
        )

    def park(
        self, text: str | None, calls: Sequence[ToolCall], usage: Usage, needs_approval: Sequence[str]
    ) -> Transition[Parked]:
        """The model asked for calls a human must approve first: park, holding no worker."""
        reason = "tool calls need approval: " + ", ".join(needs_approval)
        head = self._next(
            Phase.AWAITING_APPROVAL,
            pending_calls=list(calls),
            approval=Approval(kind="tool_calls", call_ids=[c.id for c in calls], reason=reason),
            usage=self.head.usage + usage,
            message_count=self.head.message_count + 1,
            model_retries=0,
        )
        waiting = tuple(
            ev.AwaitingApproval(run_id=head.run_id, step=head.step, call_id=c.id, tool=c.name, reason=reason)
            for c in calls
        )
        responded = ev.ModelResponded(
            run_id=head.run_id, step=head.step, text=text, tool_calls=len(calls), usage=usage
        )
        return Transition(
            Parked(head),
            messages=(AssistantMessage(content=text, tool_calls=list(calls)),),
            events=(responded, *waiting),
        )

    def delegate(
        self, text: str | None, calls: Sequence[ToolCall], usage: Usage, children: Sequence[ChildRun]
    ) -> Transition[Parked]:
        """The model called subagents: park, holding no worker, until their child runs have ended."""
        reason = "waiting for subagents: " + ", ".join(f"{c.agent} ({c.run_id})" for c in children)
        head = self._next(
            Phase.AWAITING_APPROVAL,
            pending_calls=list(calls),
            approval=Approval(
                kind="children", call_ids=[c.id for c in calls], reason=reason, children=list(children)
            ),
            children=self.head.children + len(children),
            usage=self.head.usage + usage,
            message_count=self.head.message_count + 1,
            model_retries=0,
        )
        child_of = {c.call_id: c.run_id for c in children}
        responded = ev.ModelResponded(
            run_id=head.run_id, step=head.step, text=text, tool_calls=len(calls), usage=usage
        )
        dispatched = tuple(
            ev.ToolDispatched(
                run_id=head.run_id,
                step=head.step,
                call_id=c.id,
                tool=c.name,
                arguments=c.arguments,
                child_run_id=child_of.get(c.id),
            )
            for c in calls
        )
        return Transition(
            Parked(head),
            messages=(AssistantMessage(content=text, tool_calls=list(calls)),),
            events=(responded, *dispatched),
        )

    def hand_off(
        self,
        text: str | None,
        calls: Sequence[ToolCall],
        usage: Usage,
        answers: Sequence[ToolMessage],
        handoff: HandoffRecord,
        conversation: Sequence[Message],
        *,
        model: str,
        max_steps: int,
    ) -> Transition[Thinking]:
        """The model asked to hand the conversation over: the reply, its calls answered (none ran),
        then the target's ``conversation`` (its system prompt first, at ``handoff.at``), and the
        next step thinks under the target, with ``max_steps`` more steps of its own."""
        reply = AssistantMessage(content=text, tool_calls=list(calls))
        messages: tuple[Message, ...] = (reply, *answers, *conversation)
        at = self.head.message_count + 1 + len(answers)
        if handoff.at != at or not conversation or not isinstance(conversation[0], SystemMessage):
            raise InternalInvariant(
                "a handoff's conversation must start with its system prompt", step=self.head.step
            )
        step = self.head.step + 1
        head = self._next(
            Phase.THINKING,
            step=step,
            steps_used=self.head.steps_used + 1,
            max_steps=self.head.steps_used + max_steps,
            agent_version=handoff.to_version,
            model=model,
            handoffs=[*self.head.handoffs, handoff],
            # The target's policy counts its own reprompts and retries, and a summary of the
            # conversation before stands for messages the target does not see as they were.
            reprompts=0,
            model_retries=0,
            summary=None,
            usage=self.head.usage + usage,
            message_count=self.head.message_count + len(messages),
        )
        events: tuple[ev.Event, ...] = (
            ev.ModelResponded(
                run_id=head.run_id, step=self.head.step, text=text, tool_calls=len(calls), usage=usage
            ),
            ev.HandedOff(
                run_id=head.run_id,
                step=self.head.step,
                from_agent=handoff.from_agent,
                to_agent=handoff.to_agent,
                to_version=handoff.to_version,
                call_id=handoff.call_id,
                history=handoff.history,
            ),
            ev.StepStarted(run_id=head.run_id, step=step),
        )
        return Transition(Thinking(head), messages=messages, events=events)

    def refuse_handoff(
        self,
        text: str | None,
        calls: Sequence[ToolCall],
        usage: Usage,
        answers: Sequence[ToolMessage],
        error: RunErrorInfo,
    ) -> Transition[Thinking]:
        """A handoff the runtime refuses (unknown target, past the limit): the model reads why in
        the transfer's answer, and the next step thinks under the same agent."""
        messages: tuple[Message, ...] = (AssistantMessage(content=text, tool_calls=list(calls)), *answers)
        step = self.head.step + 1
        head = self._next(
            Phase.THINKING,
            step=step,
            steps_used=self.head.steps_used + 1,
            model_retries=0,
            usage=self.head.usage + usage,
            message_count=self.head.message_count + len(messages),
        )
        events: tuple[ev.Event, ...] = (
            ev.ModelResponded(
                run_id=head.run_id, step=self.head.step, text=text, tool_calls=len(calls), usage=usage
            ),
            ev.StepFailed(run_id=head.run_id, step=self.head.step, error=error, decision="continue"),
            ev.StepStarted(run_id=head.run_id, step=step),
        )
        return Transition(Thinking(head), messages=messages, events=events)

    def reprompt(
        self, error: RunErrorInfo, raw_reply: str | None, correction: str, usage: Usage, consume_budget: bool
    ) -> Transition[Thinking]:
        """Show the model its malformed reply and what was wrong; think again (a new step if charged)."""
        step = self.head.step + 1 if consume_budget else self.head.step
        messages: tuple[Message, ...] = (
            AssistantMessage(content=raw_reply or ""),
            UserMessage(content=correction),
        )
        head = self._next(
            Phase.THINKING,
            step=step,
            steps_used=self.head.steps_used + (1 if consume_budget else 0),
            reprompts=self.head.reprompts + 1,
            usage=self.head.usage + usage,
            message_count=self.head.message_count + len(messages),
        )
        events: list[ev.Event] = [
            ev.StepFailed(run_id=head.run_id, step=self.head.step, error=error, decision="reprompt")
        ]
        if consume_budget:
            events.append(ev.StepStarted(run_id=head.run_id, step=step))
        return Transition(Thinking(head), messages=messages, events=tuple(events))

    def summarised(self, summary: Summary, usage: Usage) -> Transition[Thinking]:
        """The oldest messages were summarised (committed once); think again with the summary."""
        head = self._next(Phase.THINKING, summary=summary, usage=self.head.usage + usage)
        return Transition(Thinking(head))

    def absorb(
        self,
        messages: Sequence[Message],
        state: dict[str, Any] | None,
        applied_upto: int,
        events: Sequence[ev.Event],
    ) -> Transition[Thinking]:
        """Signals sent into the run were applied before the model is asked: their messages
        appended, the state updated, the cursor past them; the same step is thought again."""
        head = self._next(
            Phase.THINKING,
            message_count=self.head.message_count + len(messages),
            state=state,
            signals_applied=applied_upto,
        )
        return Transition(Thinking(head), messages=tuple(messages), events=tuple(events))

    def retry(self, error: RunErrorInfo, consume_budget: bool) -> Transition[Thinking]:
        """Call the model again for the same step (the failed call left no messages behind)."""
        head = self._next(
            Phase.THINKING,
            model_retries=self.head.model_retries + 1,
            steps_used=self.head.steps_used + (1 if consume_budget else 0),
        )
        return Transition(
            Thinking(head),
            events=(ev.StepFailed(run_id=head.run_id, step=head.step, error=error, decision="retry"),),
        )


@dataclass(frozen=True)
class Acting(_Live):
    """The step's tool calls are out; the last result moves the run on."""

    phase: Phase = field(init=False, default=Phase.ACTING)

    def observe(self) -> Transition[Observing]:
        """All results are in. The delivery whose result is the step's last computes this move and
        the fan-in script commits it, atomically with that result."""
        return Transition(Observing(self._next(Phase.OBSERVING)))


@dataclass(frozen=True)
class Observing(_Live):
    """All results are in; the next move is decided from them."""

    phase: Phase = field(init=False, default=Phase.OBSERVING)

    def next_step(self, results: Sequence[ToolResult]) -> Transition[Thinking]:
        messages = _tool_messages(self.head, results)
        step = self.head.step + 1
        head = self._next(
            Phase.THINKING,
            step=step,
            steps_used=self.head.steps_used + 1,
            pending_calls=[],
            done_calls=[],
            waiting_calls=[],
            approval_note="",
            message_count=self.head.message_count + len(messages),
        )
        return Transition(
            Thinking(head), messages=messages, events=(ev.StepStarted(run_id=head.run_id, step=step),)
        )

    def next_wave(self, cap: int | None) -> Transition[Acting]:
        """The wave's results are in and calls of the step still wait: send the next wave."""
        if not self.head.waiting_calls:
            raise InternalInvariant("next_wave() without waiting calls", step=self.head.step)
        wave, waiting = _wave(self.head.waiting_calls, cap)
        head = self._next(
            Phase.ACTING,
            done_calls=[*self.head.done_calls, *self.head.pending_calls],
            pending_calls=wave,
            waiting_calls=waiting,
        )
        return Transition(Acting(head), events=_dispatched(head))

    def finish(
        self, results: Sequence[ToolResult], answer: str, output: Any = None
    ) -> Transition[CompletedRun]:
        """A call of a tool that ends the run succeeded: its result is the run's answer."""
        messages = _tool_messages(self.head, results)
        head = self._next(
            Phase.COMPLETED,
            answer=answer,
            output=output,
            pending_calls=[],
            done_calls=[],
            waiting_calls=[],
            message_count=self.head.message_count + len(messages),
        )
        completed = ev.Completed(
            run_id=head.run_id, step=head.step, answer=answer, usage=head.usage, output=output
        )
        return Transition(CompletedRun(head), messages=messages, events=(completed,))

    def park_unknown(self, results: Sequence[ToolResult]) -> Transition[Parked]:
        """A non-retry-safe call's outcome is unknown and the policy asks a human."""
        unknown = [r for r in results if r.error is not None and r.error.kind == "ToolOutcomeUnknown"]
        reason = "outcome unknown (worker died mid-call) for: " + ", ".join(r.name for r in unknown)
        head = self._next(
            Phase.AWAITING_APPROVAL,
            approval=Approval(kind="unknown_outcome", call_ids=[r.call_id for r in unknown], reason=reason),
        )
        events = tuple(
            ev.AwaitingApproval(
                run_id=head.run_id, step=head.step, call_id=r.call_id, tool=r.name, reason=reason
            )
            for r in unknown
        )
        return Transition(Parked(head), events=events)


@dataclass(frozen=True)
class Parked(_Live):
    """Parked: no worker is held until a human decides."""

    phase: Phase = field(init=False, default=Phase.AWAITING_APPROVAL)

    def approve(
        self, always: bool = False, cap: int | None = None, note: str = "", by: str = ""
    ) -> Transition[Acting]:
        """Approved tool calls: dispatch them (``always``: their tools need no approval again;
        ``cap``: at most that many at once; ``note``: told to the model with their results)."""
        approved = self.head.approved_tools
        if always:
            approved = sorted({*approved, *(c.name for c in self.head.pending_calls)})
        wave, waiting = _wave(self.head.pending_calls, cap)
        head = self._next(
            Phase.ACTING,
            approval=None,
            approved_tools=approved,
            approval_note=note,
            pending_calls=wave,
            done_calls=[],
            waiting_calls=waiting,
        )
        decided = ev.ApprovalDecided(
            run_id=head.run_id, step=head.step, approve=True, note=note, by=by, always=always
        )
        return Transition(Acting(head), events=(decided, *_dispatched(head)))

    def deny(self, note: str, by: str = "") -> Transition[Thinking]:
        """Denied tool calls: none runs, and the model is told so."""
        reason = f"Denied by a human reviewer{': ' + note if note else ''}. The tool call was not executed."
        messages = tuple(
            ToolMessage(tool_call_id=c.id, name=c.name, content=reason, is_error=True)
            for c in self.head.pending_calls
        )
        decided = ev.ApprovalDecided(
            run_id=self.head.run_id, step=self.head.step, approve=False, note=note, by=by
        )
        moved = self._continue(messages)
        return Transition(moved.to, messages=moved.messages, events=(decided, *moved.events))

    def resume(self, results: Sequence[ToolResult]) -> Transition[Thinking]:
        """An unknown outcome accepted by a human: feed the step's results (unknown included) back."""
        return self._continue(_tool_messages(self.head, results))

    def _continue(self, messages: tuple[Message, ...]) -> Transition[Thinking]:
        step = self.head.step + 1
        head = self._next(
            Phase.THINKING,
            step=step,
            steps_used=self.head.steps_used + 1,
            pending_calls=[],
            done_calls=[],
            waiting_calls=[],
            approval=None,
            message_count=self.head.message_count + len(messages),
        )
        return Transition(
            Thinking(head), messages=messages, events=(ev.StepStarted(run_id=head.run_id, step=step),)
        )


def _dispatched(head: RunHead) -> tuple[ev.Event, ...]:
    """One ToolDispatched per pending call: emitted when the calls are really sent to the tools."""
    return tuple(
        ev.ToolDispatched(
            run_id=head.run_id, step=head.step, call_id=c.id, tool=c.name, arguments=c.arguments
        )
        for c in head.pending_calls
    )


def _tool_messages(head: RunHead, results: Sequence[ToolResult]) -> tuple[Message, ...]:
    """One tool message per call of the step (every wave), in call order; each must have its result."""
    calls = [*head.done_calls, *head.pending_calls]
    by_id = {r.call_id: r for r in results}
    missing = [c.id for c in calls if c.id not in by_id]
    if missing:
        raise InternalInvariant(f"observe without results for calls {missing}", step=head.step)
    # A reviewer's note on approving the calls reaches the model with their results: a message of
    # its own could not sit between the calls and their results, which providers require adjacent.
    note = f"\n\n[Approved by a human reviewer: {head.approval_note}]" if head.approval_note else ""
    return tuple(
        ToolMessage(
            tool_call_id=c.id, name=c.name, content=by_id[c.id].output + note, is_error=not by_id[c.id].ok
        )
        for c in calls
    )


def _wave(calls: Sequence[ToolCall], cap: int | None) -> tuple[list[ToolCall], list[ToolCall]]:
    """The calls to send now and those that wait, under a cap on parallel calls (None: no cap)."""
    if cap is None:
        return list(calls), []
    return list(calls[:cap]), list(calls[cap:])


@dataclass(frozen=True)
class CompletedRun(PhaseView):
    """Ended with an answer: no moves left."""

    phase: Phase = field(init=False, default=Phase.COMPLETED)


@dataclass(frozen=True)
class FailedRun(PhaseView):
    """Ended with an error: no moves left."""

    phase: Phase = field(init=False, default=Phase.FAILED)


@dataclass(frozen=True)
class InterruptedRun(PhaseView):
    """Cancelled or halted by policy: no moves left."""

    phase: Phase = field(init=False, default=Phase.INTERRUPTED)


AnyPhase = Idle | Thinking | Acting | Observing | Parked | CompletedRun | FailedRun | InterruptedRun
LivePhase = Idle | Thinking | Acting | Observing | Parked

_VIEWS: dict[Phase, type[AnyPhase]] = {
    Phase.IDLE: Idle,
    Phase.THINKING: Thinking,
    Phase.ACTING: Acting,
    Phase.OBSERVING: Observing,
    Phase.AWAITING_APPROVAL: Parked,
    Phase.COMPLETED: CompletedRun,
    Phase.FAILED: FailedRun,
    Phase.INTERRUPTED: InterruptedRun,
}


V = TypeVar("V", bound=PhaseView)


def view(head: RunHead) -> AnyPhase:
    """The typed view of a stored head; the only way from untyped state to a phase."""
    return _VIEWS[head.phase](head)


def view_as(head: RunHead, cls: type[V]) -> V:
    """The view of ``head`` as ``cls``; raises :class:`InternalInvariant` if it is in another phase."""
    current = view(head)
    if not isinstance(current, cls):
        raise InternalInvariant(
            f"run {head.run_id} is {head.phase.value}, expected {cls.__name__}", step=head.step
        )
    return current
