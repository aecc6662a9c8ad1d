"""The values a pipeline hands between steps, and the run inputs made from them.

A child run's value is its typed output (its agent's ``output_type``) or its answer text; a map
step's value is the list of its items' values in item order (skipped items left out).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

__all__ = ["as_input", "jsonable", "value_of"]


def jsonable(value: Any) -> Any:
    """The value as JSON data (what a pipeline run's output is stored as)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def as_input(value: Any) -> str:
    """A run's input made from a value when the step has no ``input`` function: text as it is,
    anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(jsonable(value), ensure_ascii=False)


def value_of(result: dict[str, Any], output_type: type[BaseModel] | None) -> Any:
    """The value of a completed child run from its recorded result."""
    if output_type is not None and result.get("output") is not None:
        return output_type.model_validate(result["output"])
    return result.get("answer") or ""
