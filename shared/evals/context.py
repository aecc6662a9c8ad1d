"""Where an eval came from: content hashes of its spec and dataset files, and the code version of
the agents it ran (the git commit of the checkout the agents module lives in, when it lives in one).

Recorded once when the eval is created, shown in the report's header: two evals with the same
hashes and code ran the same thing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["code_version", "eval_context", "sha256_of"]

_GIT_TIMEOUT_S = 5.0


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def code_version(module: str | None) -> str | None:
    """``git rev-parse HEAD`` of the checkout holding ``module``'s source; None when it is not in
    one (an installed package), git is missing, or the module cannot be found."""
    if not module:
        return None
    try:
        spec = importlib.util.find_spec(module.split(":")[0])
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    where = Path(spec.origin).resolve().parent
    try:
        done = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    sha = done.stdout.strip()
    return (
        sha
        if done.returncode == 0 and len(sha) in (40, 64) and all(c in "0123456789abcdef" for c in sha)
        else None
    )


def eval_context(
    spec_bytes: bytes | None, spec_name: str | None, dataset_bytes: bytes, agents_module: str | None
) -> dict[str, Any]:
    """The context stored with a new eval (JSON)."""
    context: dict[str, Any] = {"dataset_sha256": sha256_of(dataset_bytes)}
    if spec_bytes is not None:
        context["spec_sha256"] = sha256_of(spec_bytes)
    if spec_name:
        context["spec_file"] = spec_name
    if (sha := code_version(agents_module)) is not None:
        context["code_version"] = sha
    return context
