"""Hooks into the phase tasks: a class with no-op methods that an operator or a test overrides.

Install one with ``WESICHAIN_HOOKS=package.module:ClassName`` (``Settings.hooks``); every worker
process builds one instance. The chaos suite uses them to pause a phase, crash after a commit or
publish every task twice; production runs the no-op defaults. Hooks run inside the phase, on the
task's thread: they must be quick and must not raise (a hook that raises fails the phase like any
other bug in it).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from shared.errors import ConfigError
from shared.state import Phase, RunHead, TaskSpec
from shared.store import RunStore

__all__ = ["Hooks", "load_hooks"]


class Hooks:
    """No-op defaults; override what you need."""

    def on_claimed(self, phase: Phase, run_id: str, store: RunStore) -> None:
        """A delivery claimed a phase (or a tool call, ``Phase.ACTING``) and is about to do it."""

    def after_commit(self, phase: Phase, committed: RunHead, store: RunStore) -> None:
        """A ``phase`` task committed ``committed`` and has not published the next tasks yet."""

    def outgoing(self, spec: TaskSpec) -> Sequence[TaskSpec]:
        """The tasks to send for ``spec`` (by default just it)."""
        return (spec,)


def load_hooks(path: str | None) -> Hooks:
    """The hooks named by ``module:Class`` (an instance of it), or the no-op defaults."""
    if not path:
        return Hooks()
    module_name, _, class_name = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"cannot load hooks {path!r} (want module:Class): {exc}") from exc
    hooks = cls()
    if not isinstance(hooks, Hooks):
        raise ConfigError(f"hooks {path!r} must subclass worker.hooks.Hooks")
    return hooks
