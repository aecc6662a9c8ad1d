"""Signals in the phases: a think applies the run's pending signals first, and a run parked for
approval can be woken by a message (``shared/signals.py`` says what a signal is)."""

from __future__ import annotations

from shared import events as ev
from shared import fsm
from shared.agents import Agent
from shared.signals import absorb
from shared.state import Decision, Phase, RunHead
from shared.store import Claim, ClaimRef
from shared.tasks import decide_task
from worker.runtime import Runtime

__all__ = [
    "NOTHING_PENDING",
    "WAKE_NOTE",
    "WOKEN_BY",
    "NothingPending",
    "absorb_pending",
    "absorb_signals",
    "wake_after_park",
    "wake_for_message",
]

#: What the model reads for each call of a parked step that a message woke the run from.
WAKE_NOTE = "the user sent a new message instead of deciding on these calls"
#: Who a wake is recorded as having decided (``Decision.by``).
WOKEN_BY = "message"


class NothingPending:
    """The run has no pending signal: the think goes on as usual."""


NOTHING_PENDING = NothingPending()


def absorb_signals(
    rt: Runtime, current: fsm.Thinking, claim: Claim, agent: Agent
) -> RunHead | None | NothingPending:
    """Apply the run's pending signals before its model is asked, as one commit of their own.

    The commit appends the messages, writes the updated state and moves the cursor past them,
    and sends the think again (the same step, now with them): a worker killed before it leaves the
    signals pending for the delivery that takes the think over. Returns what was committed (None:
    fenced off), or :data:`NOTHING_PENDING`.
    """
    sent = claim.signals_sent
    if sent is not None and sent <= current.head.signals_applied:
        return NOTHING_PENDING  # the claim read the inbox's count: no round trip for an unsignalled run
    return absorb_pending(rt, current, claim.ref, agent)


def absorb_pending(
    rt: Runtime, current: fsm.Thinking, ref: ClaimRef, agent: Agent
) -> RunHead | None | NothingPending:
    """:func:`absorb_signals` as the holder of ``ref``: also what a think does when the commit of
    its answer was refused because signals came in meanwhile (the answer is dropped, and the
    think asks again with them)."""
    head = current.head
    pending = rt.store.pending_signals(head.run_id, head.signals_applied)
    if not pending:
        return NOTHING_PENDING
    applied = absorb(head, pending, agent.state_type, head.version + 1)
    if applied.upto == head.signals_applied:
        return NOTHING_PENDING
    rt.store.record_outcomes(head.run_id, applied.outcomes)
    kinds = {s.seq: s.kind for s in pending}
    events = [
        ev.SignalApplied(
            run_id=head.run_id,
            step=head.step,
            seq=seq,
            signal=kinds[seq],
            accepted=outcome.status == "accepted",
            error=outcome.error,
        )
        for seq, outcome in sorted(applied.outcomes.items())
    ]
    transition = current.absorb(applied.messages, applied.state, applied.upto, events)
    return rt.commit(current, transition, ref)


def wake_for_message(rt: Runtime, head: RunHead) -> Decision | None:
    """The decision that wakes a run parked for approval of tool calls, when its agent allows it
    and a message is pending: the calls are denied and the model thinks again, the message applied
    first. Stored like a human's decision (the first stored wins); None: nothing wakes it."""
    approval = head.approval
    if approval is None or approval.kind != "tool_calls" or not rt.agent_of(head).wake_on_message:
        return None
    if not any(s.kind == "message" for s in rt.store.pending_signals(head.run_id, head.signals_applied)):
        return None
    rt.store.submit_decision(head.run_id, head.version, Decision(approve=False, note=WAKE_NOTE, by=WOKEN_BY))
    return rt.store.load_decision(head.run_id)


def wake_after_park(rt: Runtime, parked: RunHead | None, agent: Agent) -> None:
    """A message that came in while the think asked the model is still pending when the think parks
    the run for approval, and its sender sent no wake (it saw a thinking run): the think that parked
    sends it, so the message wakes the run as one sent a moment later would."""
    if parked is None or parked.phase is not Phase.AWAITING_APPROVAL or not agent.wake_on_message:
        return
    if not any(s.kind == "message" for s in rt.store.pending_signals(parked.run_id, parked.signals_applied)):
        return
    head = rt.store.load(parked.run_id)
    if head is not None and head.phase is Phase.AWAITING_APPROVAL and head.version == parked.version:
        rt.publish([decide_task(head)], head.epoch)
