"""Human-readable rendering of events and run heads for the CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from shared.events import (
    CustomEvent,
    CustomEventsDropped,
    CustomEventsVoided,
    Event,
    SignalApplied,
    SignalReceived,
)
from shared.state import Phase, RunHead

__all__ = ["render_event", "render_head"]


def render_event(event: Event, *, worker: bool = True) -> str:
    """One line: the event's step, kind and details, and (``worker``) the process that wrote it."""
    prefix = f"[step {event.step}] {event.kind:<15}"
    detail = _DETAILS.get(event.kind, _no_detail)(event)
    if not worker:
        return f"{prefix} {detail}"
    return f"{prefix} {detail}  <{event.worker.host}/{event.worker.pid}>"


def _no_detail(event: Any) -> str:
    return ""


def _tool_completed(event: Any) -> str:
    status = "ok" if event.ok else "ERROR"
    return f"{event.tool} {status} {_short(event.output)} ({event.duration_s * 1000:.1f} ms)"


def _approval_decided(event: Any) -> str:
    verdict = "approved" if event.approve else "denied"
    return f"{verdict} by {event.by or '?'}" + (f": {event.note}" if event.note else "")


def _handed_off(event: Any) -> str:
    moved = f"{event.from_agent} -> {event.to_agent} v{event.to_version}"
    return f"{moved} id={event.call_id} ({event.history} history)"


#: How each kind of event is told on one line, after its step and kind (the rest: kind only).
_DETAILS: dict[str, Callable[[Any], str]] = {
    "RunStarted": lambda e: f"agent={e.agent} v{e.agent_version} model={e.model}",
    "TokenDelta": lambda e: repr(e.text),
    "ModelResponded": lambda e: f"text={_short(e.text)} tool_calls={e.tool_calls}",
    "ToolDispatched": lambda e: f"{e.tool}({_short(str(e.arguments))}) id={e.call_id}",
    "ToolCompleted": _tool_completed,
    "CustomEvent": lambda e: _custom_detail(e),
    "CustomEventsDropped": lambda e: _custom_detail(e),
    "CustomEventsVoided": lambda e: _custom_detail(e),
    "StepFailed": lambda e: f"{e.error.kind}: {_short(e.error.message)} -> {e.decision}",
    "AwaitingApproval": lambda e: f"{e.tool} id={e.call_id}: {e.reason}",
    "ApprovalDecided": _approval_decided,
    "HandedOff": _handed_off,
    "Completed": lambda e: f"tokens in/out {e.usage.input_tokens}/{e.usage.output_tokens}",
    "Failed": lambda e: f"{e.error.kind}: {e.error.message}",
    "Interrupted": lambda e: str(e.reason),
    "SignalReceived": lambda e: _signal_detail(e),
    "SignalApplied": lambda e: _signal_detail(e),
}


def _custom_detail(event: CustomEvent | CustomEventsDropped | CustomEventsVoided) -> str:
    """What a tool reported, dropped or had voided, on one line (the data as JSON, shortened)."""
    where = f"{event.tool} id={event.call_id}"
    match event:
        case CustomEvent():
            data = _short(json.dumps(event.data, ensure_ascii=False))
            return f"{event.tool} {event.name} {data} id={event.call_id} attempt={event.attempt}"
        case CustomEventsDropped():
            return f"{where} attempt={event.attempt}: {event.dropped} dropped (over its bounds)"
        case CustomEventsVoided():
            why = event.reason.replace("_", " ")
            return f"{where}: custom events of attempt {event.attempt} and earlier are void ({why})"


def _signal_detail(event: SignalReceived | SignalApplied) -> str:
    if event.kind == "SignalReceived":
        return f"{event.signal} #{event.seq}" + (f" from {event.by}" if event.by else "")
    verdict = "accepted" if event.accepted else f"REJECTED: {_short(event.error or '')}"
    return f"{event.signal} #{event.seq} {verdict}"


def render_head(head: RunHead) -> str:
    lines = [
        f"run      {head.run_id}",
        # After a handoff the version and model are the current agent's (the ``now`` line).
        f"agent    {head.agent}"
        + (" (started the run)" if head.handoffs else f" v{head.agent_version}")
        + f"  model {head.model}",
        f"phase    {head.phase.value}  step {head.step}/{head.max_steps}  version {head.version}",
        f"usage    {head.usage.input_tokens} in / {head.usage.output_tokens} out",
    ]
    if head.handoffs:
        lines.append(
            f"now      {head.active_agent} v{head.agent_version} (handed off {len(head.handoffs)} time(s))"
        )
        lines += [
            f"handoff  step {h.step}: {h.from_agent} -> {h.to_agent} v{h.to_version}" for h in head.handoffs
        ]
    if head.answer is not None:
        lines.append(f"answer   {head.answer}")
    if head.state is not None:
        lines.append(f"state    {json.dumps(head.state, ensure_ascii=False)[:2000]}")
    if head.error is not None:
        lines.append(f"error    {head.error.kind}: {head.error.message}")
    if head.phase is Phase.AWAITING_APPROVAL and head.approval is not None:
        lines.extend(_waiting_for(head))
    return "\n".join(lines)


def _waiting_for(head: RunHead) -> list[str]:
    """What a parked run waits on and how to move it on: no worker holds it, so someone must act."""
    approval = head.approval
    assert approval is not None
    run = head.run_id
    if approval.kind == "children":
        lines = [f"waiting  for {len(approval.children)} subagent run(s) to end:"]
        lines += [f"           {c.agent} {c.run_id} (call {c.call_id})" for c in approval.children]
        lines.append(f"           (nothing to approve; stop it with: wesichain cancel {run})")
        return lines
    calls = {c.id: c for c in head.pending_calls}
    if approval.kind == "unknown_outcome":
        lines = [f"waiting  for a human: {approval.reason}"]
    else:
        lines = [f"waiting  for a human to approve {len(approval.call_ids)} tool call(s): {approval.reason}"]
    for call_id in approval.call_ids:
        call = calls.get(call_id)
        what = f"{call.name}({_short(json.dumps(call.arguments, ensure_ascii=False))})" if call else "?"
        lines.append(f"           {what} id={call_id}")
    go_on, stop = (
        ("accept the outcome and go on", "fail the run")
        if approval.kind == "unknown_outcome"
        else ("run them", "the model is told they were denied")
    )
    lines.append(f'approve  wesichain approve {run} --note "..."   ({go_on})')
    lines.append(f'deny     wesichain deny {run} --note "..."      ({stop})')
    return lines


def _short(text: str | None, limit: int = 80) -> str:
    if text is None:
        return "-"
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
