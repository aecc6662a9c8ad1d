"""The run console: static files served at ``/`` (no build step, no CDN: shipped in the package)
and the two reads only it needs, a run's timeline and who the caller is."""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.staticfiles import StaticFiles

from producer.api.auth import Caller
from producer.api.runs import ERRORS, Svc, Who, owned_run
from producer.api.services import Services
from shared.events import read_all_events
from shared.pool import with_deaths
from shared.pool_records import Obituaries
from shared.timeline import Timeline, build_timeline

__all__ = ["STATIC", "Identity", "index", "page_headers", "router", "static_files", "timeline", "whoami"]

STATIC = Path(__file__).parent / "console"

router = APIRouter()


class Identity(BaseModel):
    """Who the caller's key says it is."""

    tenant: str | None = Field(description="The caller's tenant; null when authentication is off.")
    key_id: str | None = Field(description="The public id of the caller's key.")


def page_headers(*, scripts: Iterable[str] = (), styles: Iterable[str] = ()) -> dict[str, str]:
    """The headers of an HTML page the API serves (the console, the eval viewer): it runs only its
    own scripts and styles (from this origin, or the inline ones given, by hash), talks only to
    this origin, and no other site may frame it. Nothing in these pages needs more, so a string a
    tenant stored that escaped into markup still could not run, and a page elsewhere cannot
    overlay the console to steer a reviewer's clicks."""

    def sources(inline: Iterable[str]) -> str:
        hashes = (base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() for text in inline)
        return " ".join(["'self'", *(f"'sha256-{h}'" for h in hashes)])

    policy = "; ".join(
        [
            "default-src 'self'",
            f"script-src {sources(scripts)}",
            f"style-src {sources(styles)}",
            "img-src 'self' data:",
            "connect-src 'self'",
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ]
    )
    return {
        "Cache-Control": "no-cache",
        "Content-Security-Policy": policy,
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }


class _ConsoleFiles(StaticFiles):
    """The console's scripts and stylesheets, each only ever read as the type it is served as."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def static_files() -> StaticFiles:
    return _ConsoleFiles(directory=STATIC)


@router.get("/", include_in_schema=False)
def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers=page_headers())


@router.get("/v1/whoami", response_model=Identity, responses=ERRORS, summary="The caller's tenant")
def whoami(who: Who) -> Identity:
    return Identity(tenant=who.tenant, key_id=who.key_id)


@router.get(
    "/v1/runs/{run_id}/timeline",
    response_model=Timeline,
    responses=ERRORS,
    summary="Where a run's time went",
    description="One lane per worker process: each phase delivery from its claim to its commit, tool"
    " calls on the workers that ran them, queue waits, text streamed by a delivery that died, and"
    " takeovers, and a `worker_died` marker where a worker holding one of its claims was found dead"
    " (its liveness ran out). Times are the workers' clocks (Unix seconds). A timeline reads the"
    " run's every event: a tenant reads at most 2 timelines, memory searches or listings at once on"
    " one API process (429 ``too_many_scans``).",
)
async def timeline(run_id: str, services: Svc, who: Who) -> Timeline:
    return await run_in_threadpool(_timeline, services, who, run_id)


def _timeline(services: Services, who: Caller, run_id: str) -> Timeline:
    head = owned_run(services, who, run_id)
    store = services.store
    with services.scans.hold(who.tenant):
        events = [event for _, event in read_all_events(store, run_id)]
        built = build_timeline(head, store.checkpoints(run_id), events)
    return with_deaths(built, Obituaries(store.redis, store.keys), time.time())
