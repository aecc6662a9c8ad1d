"""Validation of the model's action: everything the model says is untrusted until it passes here."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from shared.errors import InvalidModelAction
from shared.llm.base import ModelResponse
from shared.messages import ToolCall
from shared.settings import Limits
from shared.tools import ToolSet, validation_summary

__all__ = ["accept_tool_calls"]


def accept_tool_calls(response: ModelResponse, tools: ToolSet, step: int, limits: Limits) -> list[ToolCall]:
    """Turn raw tool calls into accepted ones, or raise :class:`InvalidModelAction` saying why."""
    raw_text = response.raw or response.text
    if not response.tool_calls:
        if not (response.text or "").strip():
            raise InvalidModelAction(
                "the model returned neither text nor tool calls", step=step, raw=raw_text
            )
        return []
    if len(response.tool_calls) > limits.max_tool_calls_per_step:
        raise InvalidModelAction(
            f"{len(response.tool_calls)} tool calls in one step;"
            f" the limit is {limits.max_tool_calls_per_step}",
            step=step,
            raw=raw_text,
        )
    accepted: list[ToolCall] = []
    seen: set[str] = set()
    for index, raw in enumerate(response.tool_calls):
        tool = tools.get(raw.name)
        if tool is None:
            known = ", ".join(tools.names) or "none"
            raise InvalidModelAction(
                f"unknown tool {raw.name!r} (available: {known})",
                step=step,
                tool=raw.name,
                args=_bounded(raw.arguments),
                raw=raw_text,
            )
        arguments = _parse_arguments(raw.arguments, raw.name, step, raw_text)
        try:
            validated = tool.validate(arguments)
        except ValidationError as exc:
            raise InvalidModelAction(
                f"arguments for {raw.name!r} failed validation: {validation_summary(exc)}",
                step=step,
                tool=raw.name,
                args=_bounded(arguments),
                raw=raw_text,
            ) from None
        call_id = _unique_id(raw.id or f"call_{index}", seen)
        accepted.append(ToolCall(id=call_id, name=raw.name, arguments=validated.model_dump(mode="json")))
    return accepted


def _parse_arguments(value: Any, tool: str, step: int, raw_text: str | None) -> dict[str, Any]:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise InvalidModelAction(
                f"arguments for {tool!r} are not valid JSON: {exc}",
                step=step,
                tool=tool,
                args=_bounded(value),
                raw=raw_text,
            ) from None
    if not isinstance(value, dict):
        raise InvalidModelAction(
            f"arguments for {tool!r} must be a JSON object, got {type(value).__name__}",
            step=step,
            tool=tool,
            args=_bounded(value),
            raw=raw_text,
        )
    return value


def _unique_id(candidate: str, seen: set[str]) -> str:
    # Ids key the results hash and the task ids, so they must be unique and safe within a step.
    base = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in candidate)[:64] or "call"
    call_id, n = base, 1
    while call_id in seen:
        n += 1
        call_id = f"{base}_{n}"
    seen.add(call_id)
    return call_id


def _bounded(value: Any, limit: int = 2000) -> Any:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "...[truncated]"
