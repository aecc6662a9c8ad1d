"""Which run a log line is about: the phase context, and JSON log lines that carry it.

While a phase task runs, a context variable holds its run id, step, phase, task id, worker and
(once the run is claimed) tenant. With ``WESICHAIN_LOG_FORMAT=json`` every line the worker logs is
one JSON object with those fields added, whichever logger wrote it (the runtime's, Celery's, a
tool's), so a log pipeline can follow one run across many workers. Text stays the default.
Threads a phase starts for its own work (a model call's) run in a copy of the context.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = [
    "CONTEXT_FIELDS",
    "JsonFormatter",
    "annotate",
    "begin_phase",
    "configure",
    "end_phase",
    "phase_context",
    "use_json",
]

#: The fields of the phase context, in the order a JSON line shows them.
CONTEXT_FIELDS = ("run_id", "step", "phase", "task_id", "worker", "tenant")

_context: ContextVar[dict[str, Any] | None] = ContextVar("wesichain_phase_context", default=None)


@contextmanager
def phase_context(**fields: Any) -> Iterator[None]:
    """Every line logged inside (on this thread, and on threads started from its context) is about
    this phase."""
    token = _context.set({k: v for k, v in fields.items() if v is not None})
    try:
        yield
    finally:
        _context.reset(token)


def begin_phase(**fields: Any) -> None:
    """The task on this thread starts a phase (``LoggedTask.before_start``): lines are about it from now."""
    _context.set({k: v for k, v in fields.items() if v is not None})


def end_phase() -> None:
    """The task on this thread ended (``LoggedTask.after_return``): lines are about no phase any more."""
    _context.set(None)


def annotate(**fields: Any) -> None:
    """Add what the phase learnt since it began (its tenant and step, once the run is claimed)."""
    current = _context.get()
    if current is not None:
        current.update({k: v for k, v in fields.items() if v is not None})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the phase context, any exception."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = _context.get() or {}
        for name in CONTEXT_FIELDS:
            if name in context:
                line[name] = context[name]
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def use_json(logger: logging.Logger) -> None:
    """Give every handler of ``logger`` the JSON format."""
    for handler in logger.handlers:
        handler.setFormatter(JsonFormatter())


def configure(log_format: str) -> None:
    """Switch the root logger's handlers (and Celery's task logger's) to JSON lines, if asked."""
    if log_format != "json":
        return
    use_json(logging.getLogger())
    use_json(logging.getLogger("celery.task"))
