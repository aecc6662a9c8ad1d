"""Structured output: an agent's final answer in the shape of a pydantic model.

An agent that declares ``output_type=Report`` is asked for its final answer as JSON matching
``Report``'s schema: through the provider's native JSON-schema mode where its adapter has one
(``OutputFormat`` on the request), by instructions in the system prompt otherwise. The answer is
parsed and validated here; an invalid one is an :class:`InvalidModelAction`, reprompted (with
the schema and what failed) within the policy's bounds. The validated value is stored on the run
as JSON (``RunHead.output``); ``RunHead.output_as(Report)`` gives it back typed.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from pydantic import BaseModel, ValidationError

from shared.errors import InvalidModelAction
from shared.llm.base import OutputFormat
from shared.tools import validation_summary

__all__ = ["MAX_SCHEMA_CHARS", "instructions", "output_format", "parse_output"]

#: A schema is shown to the model in prompts; a larger one is a configuration mistake.
MAX_SCHEMA_CHARS = 20_000

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(.*?)\n\s*```\s*$", re.DOTALL)


@cache
def output_format(output_type: type[BaseModel]) -> OutputFormat:
    """The format of ``output_type``; its name is made safe for providers (letters, digits, _ -)."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", output_type.__name__)[:64] or "output"
    return OutputFormat(name=name, schema_=output_type.model_json_schema())


def instructions(fmt: OutputFormat) -> str:
    """What the system prompt says when the provider cannot be given the schema natively."""
    return (
        "When you give your final answer (not a tool call), reply with one JSON object and nothing "
        f"else, matching this JSON schema:\n{fmt.schema_text()}"
    )


def parse_output(text: str | None, output_type: type[BaseModel], step: int) -> Any:
    """The final answer validated against ``output_type``, as JSON-safe data.

    A reply wrapped in a Markdown code fence is accepted (models add them even when told not to);
    anything else that is not exactly one valid object raises :class:`InvalidModelAction`.
    """
    raw = (text or "").strip()
    fenced = _FENCE.match(raw)
    if fenced:
        raw = fenced.group(1).strip()
    try:
        value = output_type.model_validate_json(raw)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            problem = "it is not a JSON object"
        else:
            problem = validation_summary(exc)
        raise InvalidModelAction(
            f"the final answer does not match the output type {output_type.__name__}: {problem}",
            step=step,
            raw=text,
        ) from None
    return value.model_dump(mode="json")
