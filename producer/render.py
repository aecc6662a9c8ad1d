"""Human-readable rendering of events and run heads for the CLI."""

from __future__ import annotations

import json

from shared.events import Event, SignalApplied, SignalReceived
from shared.state import Phase, RunHead

__all__ = ["render_event", "render_head"]


def render_event(event: Event) -> str:
    who = f"{event.worker.host}/{event.worker.pid}"
    prefix = f"[step {event.step}] {event.kind:<15}"
    match event.kind:
        case "RunStarted":
            detail = f"agent={event.agent} v{event.agent_version} model={event.model}"
        case "TokenDelta":
            detail = repr(event.text)
        case "ModelResponded":
            detail = f"text={_short(event.text)} tool_calls={event.tool_calls}"
        case "ToolDispatched":
            detail = f"{event.tool}({_short(str(event.arguments))}) id={event.call_id}"
        case "ToolCompleted":
            status = "ok" if event.ok else "ERROR"
            detail = f"{event.tool} {status} {_short(event.output)} ({event.duration_s * 1000:.1f} ms)"
        case "StepFailed":
            detail = f"{event.error.kind}: {_short(event.error.message)} -> {event.decision}"
        case "AwaitingApproval":
            detail = f"{event.tool} id={event.call_id}: {event.reason}"
        case "ApprovalDecided":
            verdict = "approved" if event.approve else "denied"
            detail = f"{verdict} by {event.by or '?'}" + (f": {event.note}" if event.note else "")
        case "Completed":
            detail = f"tokens in/out {event.usage.input_tokens}/{event.usage.output_tokens}"
        case "Failed":
            detail = f"{event.error.kind}: {event.error.message}"
        case "Interrupted":
            detail = event.reason
        case "SignalReceived" | "SignalApplied":
            detail = _signal_detail(event)
        case _:
            detail = ""
    return f"{prefix} {detail}  <{who}>"


def _signal_detail(event: SignalReceived | SignalApplied) -> str:
    if event.kind == "SignalReceived":
        return f"{event.signal} #{event.seq}" + (f" from {event.by}" if event.by else "")
    verdict = "accepted" if event.accepted else f"REJECTED: {_short(event.error or '')}"
    return f"{event.signal} #{event.seq} {verdict}"


def render_head(head: RunHead) -> str:
    lines = [
        f"run      {head.run_id}",
        f"agent    {head.agent} v{head.agent_version}  model {head.model}",
        f"phase    {head.phase.value}  step {head.step}/{head.max_steps}  version {head.version}",
        f"usage    {head.usage.input_tokens} in / {head.usage.output_tokens} out",
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
