"""Human-readable rendering of events and run heads for the CLI."""

from __future__ import annotations

import json

from shared.events import Event
from shared.state import RunHead

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
        case "Completed":
            detail = f"tokens in/out {event.usage.input_tokens}/{event.usage.output_tokens}"
        case "Failed":
            detail = f"{event.error.kind}: {event.error.message}"
        case "Interrupted":
            detail = event.reason
        case _:
            detail = ""
    return f"{prefix} {detail}  <{who}>"


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
    return "\n".join(lines)


def _short(text: str | None, limit: int = 80) -> str:
    if text is None:
        return "-"
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
