"""An agent's custom run state: a typed model its tools read and update, kept on the run.

An agent declares ``state_type`` (a pydantic model). A run's state is its JSON on the head, so it
is checkpointed with every commit and shown with the run's status. The start phase fills it in
(from the run's request, else the model's defaults); a tool reads it as ``ctx.state`` (as it was
when the step's calls were sent) and changes it with ``ctx.update_state(field=value, ...)``, each
write validated at once against the model. A call's changes are recorded with its result, once,
like the result itself, and the observe phase applies the step's changes in call order (a failed
call's changes are dropped) and validates the state again before committing it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from shared.messages import ToolCall
from shared.request import MAX_STATE_BYTES
from shared.state import ToolResult
from shared.tools import validation_summary

__all__ = ["StateError", "apply_updates", "check_state", "initial_state"]


class StateError(ValueError):
    """A state that does not fit its agent's model (or is too large)."""


def check_state(model: type[BaseModel], value: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` validated against ``model``, as JSON-ready data; raises :class:`StateError`."""
    try:
        state: dict[str, Any] = model.model_validate(dict(value)).model_dump(mode="json")
    except ValidationError as exc:
        raise StateError(f"the run state does not fit {model.__name__}: {validation_summary(exc)}") from None
    size = len(json.dumps(state, separators=(",", ":")))
    if size > MAX_STATE_BYTES:
        raise StateError(f"the run state is {size} bytes as JSON, over the limit of {MAX_STATE_BYTES}")
    return state


def initial_state(model: type[BaseModel] | None, given: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The state a run of an agent with ``model`` starts with: ``given`` (from the run's request),
    else the model's defaults; None for an agent without a state type."""
    if model is None:
        if given:
            raise StateError("the agent declares no state_type, so a run of it takes no state")
        return None
    return check_state(model, given or {})


def apply_updates(
    model: type[BaseModel] | None,
    state: Mapping[str, Any] | None,
    calls: Sequence[ToolCall],
    results: Sequence[ToolResult],
) -> dict[str, Any] | None:
    """The state after the step's successful calls' updates, applied in call order."""
    if model is None or state is None:
        return None if state is None else dict(state)
    by_id = {r.call_id: r for r in results}
    merged = dict(state)
    changed = False
    for call in calls:
        result = by_id.get(call.id)
        if result is not None and result.ok and result.state_update:
            merged.update(result.state_update)
            changed = True
    return check_state(model, merged) if changed else dict(state)
