"""What a publish raises when the broker cannot take the message.

Kept apart from :mod:`shared.unsent` (which marks such a task's outbox unsent) because it names a
kombu exception, and ``shared`` imports neither Celery nor kombu; the client and the worker, which
both publish through Celery, catch it.
"""

from __future__ import annotations

from kombu.exceptions import OperationalError

__all__ = ["PUBLISH_ERRORS"]

#: kombu wraps connection errors of every transport in it, after Celery's own publish retries.
PUBLISH_ERRORS: tuple[type[Exception], ...] = (OperationalError,)
