"""Which queue namespaces a caller may send work to over the API.

A namespace routes a run's tasks to the workers consuming it (``shared/queues.py``), which are
often another team's. The default namespace is every caller's; any other only for a tenant an
operator allowed it (``wesichain keys namespaces``). Without authentication the caller is the
operator, who may name any.
"""

from __future__ import annotations

from typing import Protocol

from api.auth import Caller
from api.errors import ApiError
from shared.errors import InvalidRequest
from shared.queues import check_namespace

__all__ = ["AllowList", "allowed_namespace"]


class AllowList(Protocol):
    """Where a tenant's allowed namespaces are read (the API's cached :class:`SubmitGate`)."""

    def namespaces(self, tenant: str) -> tuple[str, ...]: ...


def allowed_namespace(gate: AllowList, who: Caller, raw: str | None) -> str | None:
    """The namespace a request names (None: the default one) once the caller may use it; 422 for
    a malformed name, 403 (``forbidden``) for one the caller's tenant is not allowed."""
    try:
        namespace = check_namespace(raw)
    except InvalidRequest as exc:
        raise ApiError(422, "invalid_request", exc.message) from None
    if namespace is None or who.tenant is None:
        return namespace
    allowed = gate.namespaces(who.tenant)
    if namespace not in allowed:
        raise ApiError(
            403,
            "forbidden",
            f"tenant {who.tenant} may not send runs to the queue namespace {namespace!r}",
            details={"namespace": namespace, "allowed": list(allowed)},
        )
    return namespace
