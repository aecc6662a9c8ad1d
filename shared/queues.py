"""Per-run routing: a run may name a **queue namespace**, and every task of that run goes to that
namespace's queues instead of the pool's default ones.

The default queues are ``wesichain.model``, ``wesichain.tools`` and ``wesichain.callbacks``: the
namespace ``wesichain``. A run created with ``namespace="nightly"`` has each of its tasks sent to
``nightly.model``, ``nightly.tools`` or ``nightly.callbacks`` by the same kind (a tool call to the
tools queue, its completion callback to the callbacks queue, every other phase to the model
queue), so operators can give such runs workers of their own (``wesichain worker --namespace
nightly``) and production traffic on the default queues is not starved by them. The namespace is
stored with the run's request and every task of the run is built from the run's head, so a phase
handed on by the sweeper, an outbox published again and a re-queued think all go to the same
queues. Only the queue differs: the messages are those of any other run.
"""

from __future__ import annotations

import re

from shared.errors import InvalidRequest

__all__ = [
    "DEFAULT_NAMESPACE",
    "KINDS",
    "MAX_NAMESPACE_CHARS",
    "NAMESPACE_PATTERN",
    "check_namespace",
    "namespace_queues",
    "queue_in",
]

#: The namespace of the pool's default queues (a run that names none).
DEFAULT_NAMESPACE = "wesichain"
#: The queue kinds of a namespace, by the work their tasks do.
KINDS = ("model", "tools", "callbacks")
MAX_NAMESPACE_CHARS = 48
#: What a namespace looks like (the API's schemas state it too); no dot: the queue adds ``.KIND``.
NAMESPACE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"
_NAMESPACE = re.compile(NAMESPACE_PATTERN)


def check_namespace(value: object) -> str | None:
    """A run's namespace, or None for the default one; raises :class:`InvalidRequest` for a name
    that is not 1..48 letters, digits, ``_`` and ``-`` (no dot: the queue adds ``.KIND``)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"namespace must be text, got {type(value).__name__}")
    if not value or len(value) > MAX_NAMESPACE_CHARS or not _NAMESPACE.match(value):
        raise InvalidRequest(
            f"namespace {value[:80]!r} must be 1..{MAX_NAMESPACE_CHARS} letters, digits, _ and -"
        )
    return None if value == DEFAULT_NAMESPACE else value


def queue_in(namespace: str, kind: str) -> str:
    """The queue of ``kind`` (``model``, ``tools`` or ``callbacks``) in ``namespace``."""
    if kind not in KINDS:
        raise ValueError(f"no queue kind {kind!r}")
    return f"{namespace}.{kind}"


def namespace_queues(namespace: str) -> list[str]:
    """Every queue of ``namespace``: what a worker serving it consumes."""
    return [queue_in(namespace, kind) for kind in KINDS]
