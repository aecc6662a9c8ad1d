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
from typing import TYPE_CHECKING, Any, Literal, get_type_hints, overload

from pydantic import BaseModel, TypeAdapter, ValidationError

from shared.custom_events import CustomEmitter, check_custom
from shared.errors import ConfigError
from shared.llm.base import ToolSpec
from shared.policy import Retry
from shared.settings import Limits

if TYPE_CHECKING:  # the memory store is handed in by the worker; tools need not import it
    from shared.call_memory import CallMemory

__all__ = [
    "RISKS",
    "ApprovalPredicate",
    "InvalidStateUpdate",
    "Risk",
    "Tool",
    "ToolContext",
    "ToolSet",
    "tool",
    "validation_summary",
]

#: How risky a tool's calls are; an agent can ask a human to approve every call at or above a level.
Risk = Literal["low", "medium", "high"]
RISKS: tuple[Risk, ...] = ("low", "medium", "high")
#: Given a call's validated arguments: whether a human must approve this call first.
ApprovalPredicate = Callable[[Any], bool]


class InvalidStateUpdate(ValueError):
    """A tool's change to the run's state does not fit the agent's ``state_type`` (the call fails)."""


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
    #: The run's custom state as the step's calls were sent (None for an agent without one).
    state: BaseModel | None = None
    #: This call's changes to the state, recorded with its result if it succeeds.
    state_update: dict[str, Any] = field(default_factory=dict, repr=False)
    #: Appends this delivery's custom events (set by the act phase; None: checked, then dropped).
    _emitter: CustomEmitter | None = field(default=None, repr=False)
    #: The run's tenant's long-term memory for this call (set by the act phase).
    _memory: CallMemory | None = field(default=None, repr=False)

    @property
    def idempotency_key(self) -> str:
        return f"{self.run_id}:{self.step}:{self.call_id}"

    def update_state(self, **changes: Any) -> None:
        """Change fields of the run's state; validated now against the agent's ``state_type``
        (a bad value raises ``ValidationError``, which fails the call). The changes take effect
        when the step's results are observed, in call order, and only if this call succeeds."""
        if self.state is None:
            raise TypeError("this agent declares no state_type: its runs have no state to update")
        merged = {**self.state.model_dump(), **self.state_update, **changes}
        try:
            checked = type(self.state).model_validate(merged).model_dump(mode="json")
        except ValidationError as exc:
            raise InvalidStateUpdate(f"state update refused: {validation_summary(exc)}") from None
        self.state_update.update({name: checked[name] for name in changes})

    def emit(self, name: str, data: Any = None) -> bool:
        """Report progress or a partial result to whoever follows the run, at once: a
        ``CustomEvent`` with this call's id, ``name`` a short identifier of the tool's choosing
        and ``data`` any JSON value (bounded: ``Limits.max_custom_event_bytes``).

        A bad name or data raises ``ValueError``. Events past the call's count or rate bounds are
        dropped and counted, never failing the tool; so is an event Redis could not take, or one
        from a delivery that was fenced off. Returns whether the event was appended.
        """
        if self._emitter is None:
            check_custom(name, data, Limits().max_custom_event_bytes)
            return False
        return self._emitter.emit(name, data)

    @property
    def memory(self) -> CallMemory:
        """The long-term memory of the run's tenant (``shared/memory.py``): ``get``, ``search``
        and ``list_namespaces`` read it as it is; ``put`` and ``delete`` are applied once the
        call's result is recorded, exactly once, and only if the call succeeds."""
        if self._memory is None:
            raise RuntimeError("this tool context has no memory store (it was not made by a worker)")
        return self._memory

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
    #: Run the call again when it raises or times out, at most ``retry.n`` more times, waiting
    #: ``retry.delay_s(k)`` before retry k (retry-safe tools only).
    retry: Retry | None = None
    #: A successful call ends the run, its result the run's answer (and output).
    ends_run: bool = False
    risk: Risk = "low"
    #: Whether a call needs a human's approval, from its arguments (besides the agent's rules).
    approval: ApprovalPredicate | None = None
    #: The agent a call of this tool runs as a child run (``AgentTool``); None: a function tool.
    subagent: str | None = None

    @property
    def attempt_limit_s(self) -> float:
        """The longest a call can take, all its retries and their waits included."""
        if self.retry is None:
            return self.timeout_s
        waits = sum(self.retry.delay_s(k) for k in range(self.retry.n))
        return self.timeout_s * (self.retry.n + 1) + waits

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
    *,
    name: str | None = None,
    retry_safe: bool = True,
    timeout_s: float = 60.0,
    retry: Retry | None = None,
    ends_run: bool = False,
    risk: Risk = "low",
    approval: ApprovalPredicate | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    retry_safe: bool = True,
    timeout_s: float = 60.0,
    retry: Retry | None = None,
    ends_run: bool = False,
    risk: Risk = "low",
    approval: ApprovalPredicate | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a :class:`Tool` from a typed function (usable bare or with options)."""
    if retry is not None and not retry_safe:
        raise ConfigError("a tool that is not retry-safe cannot be retried (retry=...)")
    if retry is not None and not isinstance(retry, Retry):
        raise ConfigError(f"retry must be shared.policy.Retry, got {retry!r}")
    if risk not in RISKS:
        raise ConfigError(f"risk must be one of {', '.join(RISKS)}, got {risk!r}")
    if approval is not None and not callable(approval):
        raise ConfigError("approval must be a function of the call's arguments")

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
            retry=retry,
            ends_run=ends_run,
            risk=risk,
            approval=approval,
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
