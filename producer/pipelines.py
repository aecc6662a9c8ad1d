"""Submitting a pipeline run by name, and following, cancelling it (``Client.submit_pipeline``).

Submitting stores the pipeline run (running, at no step) and sends ``wesichain.pipeline.advance``;
the workers, which import the agents module and so know the pipeline's steps, do the rest. With
``check`` the producer imports the agents module too, to refuse an unknown pipeline or an input
that does not fit at once. With a queue ``namespace`` (``shared/queues.py``) every child run it
starts, and every task that moves it on, goes to that namespace's queues: only the workers serving
the namespace run it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from shared.agents import load_registry
from shared.errors import ConfigError, InvalidRequest, WesichainError
from shared.pipeline.status import PipelineStatus, pipeline_status
from shared.pipeline.store import PipelineStore, stored_pipeline_id
from shared.pipeline.tasks import advance_task
from shared.request import check_name, validate_request

if TYPE_CHECKING:
    from producer.client import Client

__all__ = [
    "MAX_PIPELINE_ID_CHARS",
    "PipelineConflict",
    "PipelineHandle",
    "PipelineNotFound",
    "PipelineTimeout",
    "UnknownPipeline",
    "check_pipeline_request",
    "submit_pipeline",
]

#: A pipeline run id is part of its children's run ids, which are at most 200 characters.
MAX_PIPELINE_ID_CHARS = 120


class UnknownPipeline(InvalidRequest):
    """The agents module registers no pipeline by this name."""


class PipelineConflict(InvalidRequest):
    """The pipeline run id is taken by another request."""


class PipelineNotFound(WesichainError, LookupError):
    """No pipeline run has this id."""


class PipelineTimeout(WesichainError, TimeoutError):
    """``PipelineHandle.wait`` ran out of time; the pipeline run goes on."""


def submit_pipeline(
    client: Client,
    name: str,
    input: str,
    *,
    pipeline_id: str | None = None,
    tenant: str | None = None,
    check: bool = True,
    namespace: str | None = None,
) -> PipelineHandle:
    """Create the pipeline run and send its first move; the same id and request again is the same
    pipeline run (a retry after a lost answer), the same id with another request an error."""
    fields: dict[str, Any] = {"agent": name, "input": input}
    for field, value in (("tenant", tenant), ("namespace", namespace)):
        if value is not None:
            fields[field] = value
    request = validate_request(fields, client.settings.limits)
    if check:
        _check(client, name, input)
    public_id = pipeline_id if pipeline_id is not None else uuid.uuid4().hex
    check_name("pipeline_id", public_id)
    if len(public_id) > MAX_PIPELINE_ID_CHARS:
        raise InvalidRequest(f"a pipeline_id is at most {MAX_PIPELINE_ID_CHARS} characters")
    if "/" in public_id:
        # It is one segment of the pipeline run's paths (/v1/pipelines/{pipeline_id}, the
        # console's): one with '/' no path reaches, and one with '..' segments names another.
        raise InvalidRequest(f"a pipeline_id has no '/': {public_id[:80]!r}")
    # A tenant's pipeline ids are its own: another tenant's same id is another pipeline run.
    pipeline_id = stored_pipeline_id(request.tenant, public_id)
    store = PipelineStore(client.store.redis, client.store.keys, client.settings.retention_s)
    asked = (name, request.input, request.tenant, request.namespace)
    if store.create(pipeline_id, name, request.input, request.tenant, request.namespace, public_id):
        store.add_event(pipeline_id, "pipeline_started", pipeline=name)
    else:
        meta = store.meta(pipeline_id)
        if meta is None or (meta.name, meta.input, meta.tenant, meta.namespace) != asked:
            raise PipelineConflict(f"pipeline run {public_id!r} already exists (for another request)")
        if meta.seq >= 0:
            return PipelineHandle(client, pipeline_id)
        # Not started yet: the first submit may have died before sending its first move.
    client.send_run_task(advance_task(pipeline_id, -1, request.namespace))
    return PipelineHandle(client, pipeline_id)


def check_pipeline_request(
    client: Client, name: str, input: str, *, tenant: str | None = None, check: bool = True
) -> None:
    """Refuse what :func:`submit_pipeline` would refuse of this request (a schedule checks the
    pipeline runs it will start); ``check`` also imports the agents module to refuse an unknown
    pipeline or an input its first step cannot take."""
    fields: dict[str, Any] = {"agent": name, "input": input}
    if tenant is not None:
        fields["tenant"] = tenant
    validate_request(fields, client.settings.limits)
    if check:
        _check(client, name, input)


def _check(client: Client, name: str, input: str) -> None:
    registry = load_registry(client.settings.agents_module)
    try:
        pipeline = registry.pipeline(name)
    except ConfigError as exc:
        raise UnknownPipeline(str(exc)) from None
    if pipeline.input_type is not str:
        try:
            pipeline.input_type.model_validate_json(input)
        except Exception as exc:
            raise InvalidRequest(
                f"pipeline {name!r} takes a {pipeline.input_type.__name__} as JSON: {exc}"[:2000]
            ) from None


class PipelineHandle:
    """One pipeline run: its status, its events, and cancel."""

    def __init__(self, client: Client, pipeline_id: str) -> None:
        self.client = client
        self.pipeline_id = pipeline_id
        self.store = PipelineStore(client.store.redis, client.store.keys, client.settings.retention_s)

    def __repr__(self) -> str:
        return f"PipelineHandle({self.pipeline_id!r})"

    def exists(self) -> bool:
        return self.store.meta(self.pipeline_id) is not None

    def status(self) -> PipelineStatus:
        status = pipeline_status(self.store, self.pipeline_id)
        if status is None:
            raise PipelineNotFound(f"no pipeline run {self.pipeline_id!r}")
        return status

    def wait(self, timeout: float = 300.0) -> PipelineStatus:
        """Block until the pipeline run ended; raise :class:`PipelineTimeout` after ``timeout``."""
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            meta = self.store.meta(self.pipeline_id)
            if meta is None:
                raise PipelineNotFound(f"no pipeline run {self.pipeline_id!r}")
            if meta.terminal:
                return self.status()
            if time.monotonic() >= deadline:
                raise PipelineTimeout(f"pipeline run {self.pipeline_id} still running after {timeout:g}s")
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.2)

    def cancel(self) -> str:
        """Stop the pipeline run (it ends ``cancelled``) and cancel its live child runs; returns
        ``ok``, or the status it had ended with already."""
        ended = self.store.end(self.pipeline_id, None, "cancelled")
        if ended == "":
            raise PipelineNotFound(f"no pipeline run {self.pipeline_id!r}")
        if ended == "ok":
            self.store.add_event(self.pipeline_id, "pipeline_cancelled")
        self.store.cancel_children(self.pipeline_id, lambda run_id: self.client.handle(run_id).cancel())
        return ended

    def events(
        self, *, follow: bool = True, after: str = "0-0", timeout: float = 300.0
    ) -> Iterator[dict[str, Any]]:
        """The pipeline run's events in order (each child's ``run_id`` leads to its own events);
        with ``follow``, until it ended and every event is read (or ``timeout``)."""
        cursor = after
        deadline = time.monotonic() + timeout
        while True:
            batch = self.store.events(self.pipeline_id, after=cursor)
            for event_id, event in batch:
                cursor = event_id
                yield {"id": event_id, **event}
            if batch:
                continue
            meta = self.store.meta(self.pipeline_id)
            if not follow or meta is None or meta.terminal or time.monotonic() > deadline:
                if meta is not None and meta.terminal:
                    for event_id, event in self.store.events(self.pipeline_id, after=cursor):
                        yield {"id": event_id, **event}
                return
            time.sleep(0.1)
