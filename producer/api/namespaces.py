"""Which queue namespaces, and which Celery callbacks, a caller may send work to over the API;
which models it may name for a run.

A namespace routes a run's tasks to the workers consuming it (``shared/queues.py``), which are
often another team's. The default namespace is every caller's; any other only for a tenant an
operator allowed it (``wesichain keys namespaces``). A Celery completion callback puts a message
of the tenant's naming on a queue, so its task and queue are allow-listed the same way
(``wesichain keys celery-callbacks``); a webhook needs no allowance. Without authentication the
caller is the operator, who may name any (but the runtime's reserved tasks and queues, which no
request may name: ``shared/request.py``).

A model a request names for a run (its ``model``, an assistant's configuration) is spent on an
account and under terms an operator chose, so it is allow-listed too (``wesichain keys models``):
a tenant allowed none runs its agents' own models. The check is here, where a tenant's request
comes in, and nowhere on the workers: the start message is trusted from whoever may publish it
(the broker's users), exactly as for namespaces.
"""

from __future__ import annotations

from typing import Protocol

from producer.api.auth import Caller
from producer.api.errors import ApiError
from shared.errors import InvalidRequest
from shared.queues import check_namespace
from shared.state import Callback, RunHead
from shared.tenants import (
    CeleryCallbacks,
    ModelNotAllowed,
    NotAllowed,
    TenantSettings,
    check_callback_allowed,
    check_copy_allowed,
    check_model_allowed,
    check_namespace_allowed,
)

__all__ = [
    "AllowList",
    "CachedAllowList",
    "allowed_again",
    "allowed_callback",
    "allowed_model",
    "allowed_models",
    "allowed_namespace",
    "model_refusal",
    "refusal",
]


class AllowList(Protocol):
    """Where a tenant's allow-lists are read (the API's cached :class:`SubmitGate`)."""

    def namespaces(self, tenant: str) -> tuple[str, ...]: ...

    def celery_callbacks(self, tenant: str) -> CeleryCallbacks: ...

    def models(self, tenant: str) -> tuple[str, ...]: ...


class CachedAllowList:
    """The allow-lists of one tenant's settings as read once (``SubmitGate.cached``): a request
    checked against them reads nothing, whenever the cache would have expired."""

    def __init__(self, settings: TenantSettings) -> None:
        self.settings = settings

    def namespaces(self, tenant: str) -> tuple[str, ...]:
        return self.settings.namespaces

    def celery_callbacks(self, tenant: str) -> CeleryCallbacks:
        return self.settings.callbacks

    def models(self, tenant: str) -> tuple[str, ...]:
        return self.settings.models


def allowed_namespace(gate: AllowList, who: Caller, raw: str | None) -> str | None:
    """The namespace a request names (None: the default one) once the caller may use it; 422 for
    a malformed name, 403 (``forbidden``) for one the caller's tenant is not allowed."""
    try:
        namespace = check_namespace(raw)
    except InvalidRequest as exc:
        raise ApiError(422, "invalid_request", exc.message) from None
    if namespace is None or who.tenant is None:
        return namespace
    try:
        check_namespace_allowed(who.tenant, namespace, gate.namespaces(who.tenant))
    except NotAllowed as exc:
        raise refusal(exc) from None
    return namespace


def allowed_callback(gate: AllowList, who: Caller, callback: Callback | None) -> None:
    """Refuse (403 ``forbidden``) a Celery callback whose task, or queue, the caller's tenant was
    not allowed (``check_callback_allowed``)."""
    if callback is None or callback.task is None or who.tenant is None:
        return
    try:
        check_callback_allowed(who.tenant, callback.task, callback.queue, gate.celery_callbacks(who.tenant))
    except NotAllowed as exc:
        raise refusal(exc) from None


def allowed_again(gate: AllowList, who: Caller, source: RunHead, *, callback: bool) -> None:
    """Refuse (403 ``forbidden``) a new run copied from ``source`` (a retry, with its callback; a
    fork, without) whose namespace or Celery callback the caller's tenant is no longer allowed
    (``check_copy_allowed``)."""
    if who.tenant is None:
        return
    try:
        check_copy_allowed(
            source, gate.namespaces(who.tenant), gate.celery_callbacks(who.tenant), callback=callback
        )
    except NotAllowed as exc:
        raise refusal(exc) from None


def refusal(exc: NotAllowed) -> ApiError:
    """The API's answer to a destination the tenant may not send work to: 403 ``forbidden``."""
    return ApiError(403, "forbidden", exc.message, details=exc.details)


def allowed_models(gate: AllowList, who: Caller) -> tuple[str, ...] | None:
    """The models the caller may name for a run (for :class:`~producer.client.Client`'s
    ``allowed_models``, which checks an assistant's too); None: any (no tenant)."""
    return gate.models(who.tenant) if who.tenant is not None else None


def allowed_model(gate: AllowList, who: Caller, model: str | None) -> None:
    """Refuse (403 ``model_not_allowed``) a model the caller's tenant may not name for a run."""
    if model is None or who.tenant is None:
        return
    try:
        check_model_allowed(who.tenant, model, gate.models(who.tenant))
    except ModelNotAllowed as exc:
        raise model_refusal(exc) from None


def model_refusal(exc: ModelNotAllowed) -> ApiError:
    """The API's answer to a model the tenant may not name: 403 ``model_not_allowed``, whose
    details name the model and the tenant's allowed ones."""
    return ApiError(403, "model_not_allowed", exc.message, details=exc.details)
