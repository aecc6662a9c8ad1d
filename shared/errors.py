"""Structured errors.

Every way a run can fail is one of these, and a failed run carries it in its state and in its
``Failed`` event as a :class:`RunErrorInfo` (a JSON-safe record), so it says exactly why::

    WesichainError
     ├── PolicyConfigInvalid      a policy that could loop forever or is malformed (developer)
     ├── ConfigError              bad settings: URL, agent module, model string (operator)
     ├── StoreFull                Redis is nearly at its maxmemory: new runs are refused (operator)
     ├── ArchiveUnavailable       the run archive's database cannot be reached or used (operator)
     └── RunError                 a run cannot go on
          ├── InvalidRequest        what a producer asked for breaks a limit or is malformed
          ├── ModelTransport        the provider could not be reached or answered badly
          ├── InvalidModelAction    the model asked for something the runtime refuses
          ├── ToolDispatch          a tool raised, timed out or got bad arguments
          ├── ToolOutcomeUnknown    a non-retry-safe tool's worker died mid-call
          ├── BudgetExceeded        step budget spent
          ├── PoisonPhase           a phase crashed its worker too many times
          └── InternalInvariant     a bug: state that must not exist
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

__all__ = [
    "ArchiveUnavailable",
    "BudgetExceeded",
    "ConfigError",
    "ErrorKind",
    "InternalInvariant",
    "InvalidModelAction",
    "InvalidRequest",
    "MAX_EXCERPT",
    "ModelTransport",
    "PoisonPhase",
    "PolicyConfigInvalid",
    "RunConfigError",
    "RunError",
    "RunErrorInfo",
    "StoreFull",
    "ThreadBusy",
    "ToolDispatch",
    "ToolOutcomeUnknown",
    "WesichainError",
    "excerpt",
]

ErrorKind = Literal[
    "InvalidRequest",
    "ModelTransport",
    "InvalidModelAction",
    "ToolDispatch",
    "ToolOutcomeUnknown",
    "BudgetExceeded",
    "PoisonPhase",
    "PolicyConfigInvalid",
    "InternalInvariant",
    "Config",
    "ThreadBusy",
]

#: Bound on any excerpt of untrusted text copied into an error (model output, HTTP bodies).
MAX_EXCERPT = 2000


def excerpt(text: str | None, limit: int = MAX_EXCERPT) -> str | None:
    if text is None:
        return None
    return text if len(text) <= limit else text[:limit] + f"...[{len(text) - limit} more chars]"


class RunErrorInfo(BaseModel):
    """The persisted form of a run's error."""

    kind: ErrorKind
    message: str
    step: int | None = None
    tool: str | None = None
    details: dict[str, Any] = {}


class WesichainError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(WesichainError):
    """Settings that cannot work: a bad URL, a missing agent module, an unknown provider."""


class StoreFull(WesichainError):
    """Redis holds nearly as much as its ``maxmemory`` allows: a new run is refused (it is not
    created), so the runs already going can finish in the memory left."""


class ArchiveUnavailable(WesichainError):
    """The run archive's database cannot be reached or refused the work (runs stay in Redis)."""


class PolicyConfigInvalid(WesichainError):
    """A policy that is malformed or could retry without bound."""


class RunError(WesichainError):
    """A reason a run cannot go on; ``info()`` is its persisted form."""

    kind: ErrorKind = "InternalInvariant"

    def __init__(self, message: str, *, step: int | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.step = step
        self.details = details

    def info(self) -> RunErrorInfo:
        tool = self.details.get("tool")
        extra = {k: v for k, v in self.details.items() if k != "tool" and v is not None}
        return RunErrorInfo(kind=self.kind, message=self.message, step=self.step, tool=tool, details=extra)


class RunConfigError(RunError):
    """The run names something the workers cannot provide: an unknown agent or model provider."""

    kind = "Config"


class InvalidRequest(RunError, ValueError):
    """What a producer asked for cannot be run: a size over its limit, a missing or malformed field.

    Raised to the producer when it can be told at once (the client, the HTTP API); recorded as the
    error of a failed run when the request arrived as a bare Celery message.
    """

    kind = "InvalidRequest"


class ThreadBusy(RunError):
    """A run was submitted with the ``reject`` thread policy while another run of its thread has
    not ended (``docs/agents.md``, "Threads and a second message").

    ``run_id`` names the busy run. Retrying later makes sense (``retryable``): the thread takes a
    new run once that one ends. The run was not created (a bare start message, which nobody
    answers, records its run failed with this kind instead).
    """

    kind = "ThreadBusy"
    retryable = True

    def __init__(self, thread_id: str, run_id: str, *, step: int | None = None) -> None:
        super().__init__(
            f"thread {thread_id!r} is busy with run {run_id} (thread policy 'reject'): submit again once"
            " it has ended, or choose another thread policy",
            step=step,
            thread_id=thread_id,
            run_id=run_id,
            retryable=True,
        )
        self.thread_id = thread_id
        self.run_id = run_id


class ModelTransport(RunError):
    """The provider failed: connection, timeout, HTTP status, malformed body or stream.

    ``retryable`` says whether the same request may succeed later (429, 5xx, connection errors).
    """

    kind = "ModelTransport"

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        retryable: bool = False,
        body: str | None = None,
        step: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(
            message,
            step=step,
            status_code=status_code,
            retryable=retryable,
            body=excerpt(body),
            retry_after_s=retry_after_s,
        )
        self.status_code = status_code
        self.retryable = retryable
        #: How long the provider asked to wait (its ``Retry-After``), when it said.
        self.retry_after_s = retry_after_s


class InvalidModelAction(RunError):
    """The model's action is malformed: an unknown tool, arguments that are not a JSON object,
    or arguments failing the tool's schema."""

    kind = "InvalidModelAction"

    def __init__(
        self,
        message: str,
        *,
        step: int | None = None,
        tool: str | None = None,
        args: Any = None,
        raw: str | None = None,
    ) -> None:
        super().__init__(message, step=step, tool=tool, args=args, raw=excerpt(raw))
        self.tool = tool
        # Not ``self.args``: that is BaseException's tuple of constructor arguments.
        self.tool_args = args
        self.raw = raw


class ToolDispatch(RunError):
    """A tool raised, timed out, got bad arguments, or is not registered."""

    kind = "ToolDispatch"


class ToolOutcomeUnknown(RunError):
    """A non-retry-safe tool's call may or may not have had its effect.

    Its worker died mid-call, it stalled past its lease, or it ran past its timeout.
    """

    kind = "ToolOutcomeUnknown"


class BudgetExceeded(RunError):
    """The run's step budget was spent before the model gave a final answer."""

    kind = "BudgetExceeded"


class PoisonPhase(RunError):
    """A phase was started too often without finishing (it crashes its workers)."""

    kind = "PoisonPhase"


class InternalInvariant(RunError):
    """A bug: state that must not exist, or an exception the runtime did not expect."""

    kind = "InternalInvariant"
