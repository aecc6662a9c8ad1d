"""The errors of evals: a spec or dataset that cannot run, an eval that does not exist."""

from __future__ import annotations

from shared.errors import ConfigError, WesichainError

__all__ = ["EvalNotFound", "EvalSpecError"]


class EvalSpecError(ConfigError):
    """An eval spec (or its dataset, or a scorer) that cannot be run; the message says where and why."""


class EvalNotFound(WesichainError, LookupError):
    """No eval has this id (never created, or expired after its retention)."""
