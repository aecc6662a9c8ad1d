"""Who is calling: the tenant of the caller's API key (``Authorization: Bearer wsk_...``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import ApiError
from api.services import Services

__all__ = ["Caller", "caller"]


@dataclass(frozen=True)
class Caller:
    #: The tenant whose runs the caller sees; None when authentication is off (the operator's view).
    tenant: str | None
    key_id: str | None


_CHALLENGE = {"WWW-Authenticate": "Bearer"}

#: Declares the scheme in the OpenAPI document; the check itself is :func:`caller`'s.
_BEARER = HTTPBearer(auto_error=False, description="An API key made with `wesichain keys create`.")


def caller(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]
) -> Caller:
    """The authenticated caller; 401 without a live key."""
    services: Services = request.app.state.services
    if not services.config.auth:
        return Caller(tenant=None, key_id=None)
    if credentials is None or not credentials.credentials.strip():
        raise ApiError(
            401, "unauthorized", "send an API key as 'Authorization: Bearer <key>'", headers=_CHALLENGE
        )
    record = services.tenants.authenticate(credentials.credentials.strip())
    if record is None:
        raise ApiError(401, "unauthorized", "the API key is unknown or revoked", headers=_CHALLENGE)
    return Caller(tenant=record.tenant, key_id=record.id)
