"""The API's tests' real ``wesichain api`` process (:mod:`worker.testing.api`) and helpers to call it."""

from __future__ import annotations

from typing import Any

import httpx

import tests.broker  # noqa: F401  (installs the session's broker rule)
from tests.harness import wait_until
from worker.testing.api import ApiProcess, bearer

__all__ = ["ApiProcess", "bearer", "wait_status"]


def wait_status(http: httpx.Client, run_id: str, statuses: set[str], timeout: float = 60) -> dict[str, Any]:
    """Poll ``GET /v1/runs/{id}`` until the run's status is one of ``statuses``; its view."""

    def reached() -> dict[str, Any] | None:
        response = http.get(f"/v1/runs/{run_id}")
        assert response.status_code == 200, response.text
        run: dict[str, Any] = response.json()
        return run if run["status"] in statuses else None

    run: dict[str, Any] = wait_until(
        reached, timeout=timeout, interval=0.05, what=f"run {run_id} to be {statuses}"
    )
    return run
