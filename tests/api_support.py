"""The API's tests' real ``wesichain api`` process (:mod:`worker.testing.api`) and helpers to call it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

import tests.broker  # noqa: F401  (installs the session's broker rule)
from tests.harness import wait_until
from worker.testing.api import ApiProcess, bearer

__all__ = ["END", "SSE", "ApiProcess", "Frame", "bearer", "frames", "wait_status"]


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


# -- Server-Sent Events ---------------------------------------------------------------------------

END = {"Completed", "Failed", "Interrupted"}
SSE = {"accept": "text/event-stream"}


@dataclass
class Frame:
    id: str | None = None
    data: str = ""
    comments: list[str] = field(default_factory=list)

    @property
    def event(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.data)
        return value


def frames(response: httpx.Response) -> Iterator[Frame]:
    """The SSE messages of a response (comments and retry hints as frames without data)."""
    frame = Frame()
    for line in response.iter_lines():
        if line == "":
            yield frame
            frame = Frame()
        elif line.startswith(":"):
            frame.comments.append(line[1:].strip())
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "id":
                frame.id = value
            elif name == "data":
                frame.data += value
