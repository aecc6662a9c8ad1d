"""Typed tools.

A tool is a function whose first parameter is a pydantic model of its arguments and whose return
annotation is its result type; an optional second parameter receives the :class:`ToolContext`.
The JSON schema the model sees is generated from the arguments model, never written by hand::

    class AddArgs(BaseModel):
        a: float
        b: float

    @tool
    def add(args: AddArgs) -> float:
        "Add two numbers."
        return args.a + args.b

Sync and async functions both work. Arguments are validated before the tool runs.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, get_type_hints, overload

from pydantic import BaseModel, TypeAdapter, ValidationError

from shared.errors import ConfigError
from shared.llm.base import ToolSpec

__all__ = ["Tool", "ToolContext", "ToolSet", "tool", "validation_summary"]


@dataclass(frozen=True)
class ToolContext:
    """What a running tool knows about its call.

    ``idempotency_key`` is stable across redeliveries of the same call (``run_id:step:call_id``):
    pass it to any external API that deduplicates, so a re-run after a crash has no second effect.
    """

    run_id: str
    step: int
    call_id: str
    deadline: float
    _cancel_check: Callable[[], bool] = field(default=lambda: False, repr=False)

    @property
    def idempotency_key(self) -> str:
        return f"{self.run_id}:{self.step}:{self.call_id}"

    def cancelled(self) -> bool:
        """True once the run was cancelled; a long tool should check it and return early."""
        return self._cancel_check()

    def remaining_s(self) -> float:
        return max(0.0, self.deadline - time.time())


@dataclass(frozen=True)
class Tool:
    """A typed tool: its name, description, argument model, result type, retry safety and timeout."""

    name: str
    description: str
    args_model: type[BaseModel]
    result_adapter: TypeAdapter[Any]
    fn: Callable[..., Any]
    takes_context: bool
    #: Whether re-running the call after an unknown outcome (its worker died mid-call) is safe.
    retry_safe: bool = True
    timeout_s: float = 60.0

    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name, description=self.description, parameters=self.args_model.model_json_schema()
        )

    def validate(self, arguments: dict[str, Any]) -> BaseModel:
        """Raises ``pydantic.ValidationError`` for arguments that do not fit the schema."""
        return self.args_model.model_validate(arguments)

    def invoke(self, args: BaseModel, ctx: ToolContext) -> str:
        """Run the tool and return its result as JSON text (the result type is checked too)."""
        call_args: tuple[Any, ...] = (args, ctx) if self.takes_context else (args,)
        result = self.fn(*call_args)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        checked = self.result_adapter.validate_python(result)
        if isinstance(checked, str):
            return checked
        return self.result_adapter.dump_json(checked).decode()


async def _await(awaitable: Any) -> Any:
    return await awaitable


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *, name: str | None = None, retry_safe: bool = True, timeout_s: float = 60.0
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    retry_safe: bool = True,
    timeout_s: float = 60.0,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a :class:`Tool` from a typed function (usable bare or with options)."""

    def build(f: Callable[..., Any]) -> Tool:
        hints = get_type_hints(f)
        params = list(inspect.signature(f).parameters.values())
        if not params or params[0].name not in hints:
            raise ConfigError(f"tool {f.__name__!r}: first parameter must be annotated with a pydantic model")
        args_model = hints[params[0].name]
        if not (isinstance(args_model, type) and issubclass(args_model, BaseModel)):
            raise ConfigError(
                f"tool {f.__name__!r}: arguments must be a pydantic BaseModel, got {args_model!r}"
            )
        if "return" not in hints:
            raise ConfigError(f"tool {f.__name__!r}: the return type must be annotated")
        if len(params) > 2:
            raise ConfigError(
                f"tool {f.__name__!r}: takes (args) or (args, ctx), not {len(params)} parameters"
            )
        description = inspect.cleandoc(f.__doc__ or "").strip()
        if not description:
            raise ConfigError(
                f"tool {f.__name__!r}: needs a docstring; it is the description the model reads"
            )
        if timeout_s <= 0:
            raise ConfigError(f"tool {f.__name__!r}: timeout_s must be > 0")
        return Tool(
            name=name or f.__name__,
            description=description,
            args_model=args_model,
            result_adapter=TypeAdapter(hints["return"]),
            fn=f,
            takes_context=len(params) == 2,
            retry_safe=retry_safe,
            timeout_s=timeout_s,
        )

    return build(fn) if fn is not None else build


class ToolSet:
    """An immutable, name-indexed set of tools; duplicate names are rejected when it is built."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        by_name: dict[str, Tool] = {}
        for t in tools:
            if t.name in by_name:
                raise ConfigError(f"duplicate tool name {t.name!r} in ToolSet")
            by_name[t.name] = t
        self._tools = by_name
        self._specs = [t.spec() for t in by_name.values()]

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def specs(self) -> list[ToolSpec]:
        return list(self._specs)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)


def validation_summary(exc: ValidationError, limit: int = 5) -> str:
    """A short, model-readable account of what failed validation."""
    parts = []
    for err in exc.errors()[:limit]:
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
