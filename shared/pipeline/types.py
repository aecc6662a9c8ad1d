"""The types a pipeline hands between steps, and whether one fits where another is expected.

Only what mapping functions declare is checked: an unannotated argument accepts anything (a
lambda), and a value's type is its agent's ``output_type`` (``str`` without one), ``list[...]`` of
that after a ``map``.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

__all__ = ["accepts", "is_model", "item_type", "parameter_type", "return_type", "type_name"]


def parameter_type(function: Callable[..., Any]) -> Any:
    """The annotated type of a mapping function's one argument (Any when unannotated)."""
    return _hints(function).get("__param__", Any)


def return_type(function: Callable[..., Any]) -> Any:
    """The annotated return type of a mapping function (Any when unannotated)."""
    return _hints(function).get("return", Any)


def _hints(function: Callable[..., Any]) -> dict[str, Any]:
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # unresolvable annotations (a forward reference): nothing to check
        return {}
    code = getattr(function, "__code__", None)
    names = code.co_varnames[: code.co_argcount] if code is not None else ()
    if names and names[0] in hints:
        hints["__param__"] = hints[names[0]]
    return hints


def accepts(expected: Any, actual: Any) -> bool:
    """Whether a value of type ``actual`` fits where ``expected`` is annotated (Any fits both ways)."""
    if expected is Any or actual is Any or expected is object:
        return True
    origin = typing.get_origin(expected)
    if origin in (typing.Union, _UnionType):
        return any(accepts(arm, actual) for arm in typing.get_args(expected))
    if _is_list(expected) or _is_list(actual):
        return _is_list(expected) and _is_list(actual) and accepts(item_type(expected), item_type(actual))
    if isinstance(expected, type) and isinstance(actual, type):
        return issubclass(actual, expected)
    return bool(expected == actual)


def _is_list(t: Any) -> bool:
    return t is list or typing.get_origin(t) is list


def item_type(t: Any) -> Any:
    """The item type of ``list[X]`` (Any for a bare ``list`` or anything else)."""
    args = typing.get_args(t) if _is_list(t) else ()
    return args[0] if args else Any


def type_name(t: Any) -> str:
    """A type as a message shows it: ``Draft``, ``list[Draft]``, ``Draft | None``."""
    if t is Any:
        return "Any"
    if _is_list(t):
        return f"list[{type_name(item_type(t))}]"
    if typing.get_origin(t) in (typing.Union, _UnionType):
        return " | ".join(type_name(arm) for arm in typing.get_args(t))
    if t is type(None):
        return "None"
    return t.__name__ if isinstance(t, type) else str(t).replace("typing.", "")


def is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


_UnionType = type(int | str)
