"""The FastAPI application of ``wesichain api``."""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from producer.api import (
    assistants,
    console,
    evals,
    events,
    memory,
    meta,
    operator,
    pipelines,
    runs,
    schedules,
    search,
    signals,
)
from producer.api.auth import LoopbackOnly
from producer.api.body_limit import BodyLimit
from producer.api.config import ApiConfig
from producer.api.errors import install_error_handlers
from producer.api.methods import HeadAsGet
from producer.api.services import Services
from producer.api.targets import OriginForm

__all__ = ["API_VERSION", "create_app", "openapi_document"]

API_VERSION = "1.0.0"

_DESCRIPTION = (
    "Start, follow and steer Wesichain agent runs from any service. Authenticate with an API key"
    " (`Authorization: Bearer wsk_...`); a key's tenant sees only its own runs. Every error is"
    ' `{"error": {"kind", "message", "details"}}`.'
)


def create_app(config: ApiConfig | None = None) -> FastAPI:
    """The app; without ``config``, configured from the environment (``wesichain api`` does that)."""
    config = config or ApiConfig.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services = Services(config)
        await services.open()
        app.state.services = services
        try:
            yield
        finally:
            await services.close()

    app = FastAPI(
        **_telemetry(config),
        title="Wesichain",
        version=API_VERSION,
        description=_DESCRIPTION,
        lifespan=lifespan,
        # Only a body that says it is JSON is read as JSON; any other, one with no Content-Type
        # included, is a 415 (errors.py). A browser sends such a body cross-site without asking
        # the server first (no preflight), so an API answering it would act on requests another
        # site made in the user's browser: with authentication off, on a developer's machine.
        strict_content_type=True,
        # A path with a slash too many or too few is redirected by the 404 handler, relatively
        # (targets.py): Starlette's own redirect names whatever host the request's Host header did.
        redirect_slashes=False,
    )
    install_error_handlers(app)
    app.include_router(runs.router)
    app.include_router(signals.router)
    app.include_router(search.router)
    app.include_router(events.router)
    app.include_router(pipelines.router)
    app.include_router(memory.router)
    app.include_router(assistants.router)
    app.include_router(schedules.router)
    app.include_router(meta.router)
    app.include_router(operator.router)
    app.include_router(console.router)
    app.include_router(evals.router)
    app.include_router(evals.pages)
    app.mount("/console", console.static_files(), name="console")
    # Starlette runs the middleware added last first. The common submit is served by the route's
    # own code without the framework's routing (runs.py), inside the body limit and the guard. A
    # HEAD is served as a GET (methods.py). The
    # body limit goes around everything that could read a body (routes, auth, error handlers);
    # with authentication off, the loopback guard goes around it, so that a caller it refuses does
    # not get as far as sending a body.
    app.add_middleware(runs.SubmitShortcut, api=app)
    app.add_middleware(HeadAsGet)
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes, timeout_s=config.body_timeout_s)
    if not config.auth:
        app.add_middleware(LoopbackOnly)
    # Outermost: the loopback guard checks the host a target in absolute-form names.
    app.add_middleware(OriginForm)
    return app


def _telemetry(config: ApiConfig) -> dict[str, Any]:
    """FastAPI's own OpenTelemetry instrumentation (in the versions that have it) follows the
    product's switch, ``WESICHAIN_OTEL``: on, it traces requests once a tracer provider is set up;
    off, nothing is asked per request. Left to its defaults it asks OpenTelemetry for its global
    providers on every request, which read the environment each time: 2 % of the API process's
    CPU per submit, with nothing configured."""
    if config.settings.otel or "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document the app serves (docs/openapi.json holds a copy)."""
    app = create_app(ApiConfig(settings=_placeholder_settings()))
    document: dict[str, Any] = json.loads(json.dumps(app.openapi()))
    return document


def _placeholder_settings() -> Any:
    # The document does not depend on where Redis is; nothing connects while it is built.
    from shared.settings import Settings

    return Settings()
