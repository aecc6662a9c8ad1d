"""A run exported whole, as one JSON document (for a support ticket, an audit, another system).

Everything a client can read of the run, wherever it is kept (Redis or the archive): its head, the
conversation, every checkpoint, every event with its stream id, every tool result by step, and how
its completion callback went. Values are the models' own JSON, so ``RunExport.model_validate_json``
reads an export back into the same types.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel

from shared.events import Event, read_all_events
from shared.messages import Message
from shared.state import CallbackState, RunHead, ToolResult
from shared.store import RunStore

__all__ = ["EXPORT_FORMAT", "ExportedEvent", "ExportedResult", "RunExport", "export_run"]

EXPORT_FORMAT: Literal["wesichain.run.v1"] = "wesichain.run.v1"


class ExportedEvent(BaseModel):
    #: The event's id in the run's stream (resume after it with ``events --after``).
    stream_id: str
    event: Event


class ExportedResult(BaseModel):
    step: int
    result: ToolResult


class RunExport(BaseModel):
    format: Literal["wesichain.run.v1"] = EXPORT_FORMAT
    exported_at: float
    run: RunHead
    messages: list[Message]
    checkpoints: list[RunHead]
    events: list[ExportedEvent]
    tool_results: list[ExportedResult]
    callback: CallbackState | None = None


def export_run(store: RunStore, run_id: str) -> RunExport | None:
    """The run whole (None: there is no such run, in Redis or the archive)."""
    head = store.load(run_id)
    if head is None:
        return None
    events = [
        ExportedEvent(stream_id=stream_id, event=event) for stream_id, event in read_all_events(store, run_id)
    ]
    callback = store.callback_state(run_id)
    return RunExport(
        exported_at=time.time(),
        run=head,
        messages=store.load_messages(run_id),
        checkpoints=store.checkpoints(run_id),
        events=events,
        tool_results=[
            ExportedResult(step=step, result=result)
            for step in range(1, head.step + 1)
            for result in sorted(store.load_results(run_id, step), key=lambda r: r.call_id)
        ],
        callback=CallbackState.model_validate_json(callback) if callback is not None else None,
    )
