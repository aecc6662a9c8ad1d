"""Who is calling: the tenant of the caller's API key (``Authorization: Bearer wsk_...``); and,
with authentication off, the guard that serves only callers on this host."""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import ASGIApp, Receive, Scope, Send

from producer.api.errors import ApiError, error_response
from producer.api.services import Services
from shared.tenants import live_record

__all__ = ["Caller", "LoopbackOnly", "bearer_credentials", "caller", "caller_with"]

_log = logging.getLogger("wesichain.api")


@dataclass(frozen=True)
class Caller:
    #: The tenant whose runs the caller sees; None when authentication is off (the operator's view).
    tenant: str | None
    key_id: str | None


_CHALLENGE = {"WWW-Authenticate": "Bearer"}

#: Declares the scheme in the OpenAPI document; the check itself is :func:`caller`'s.
_BEARER = HTTPBearer(auto_error=False, description="An API key made with `wesichain keys create`.")


async def caller(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]
) -> Caller:
    """The authenticated caller; 401 without a live key. Read on the event loop's Redis client:
    every request depends on it, and a plain function would cost each a hop to a worker thread."""
    services: Services = request.app.state.services
    return await caller_with(services, credentials.credentials if credentials is not None else None)


def bearer_credentials(authorization: str | None) -> str | None:
    """The credentials of an ``Authorization`` header of the ``Bearer`` scheme, as the route's
    ``HTTPBearer`` reads them (None for none, or another scheme)."""
    if not authorization:
        return None
    scheme, _, credentials = authorization.partition(" ")
    credentials = credentials.strip()
    return credentials if scheme.lower() == "bearer" and credentials else None


async def caller_with(services: Services, credentials: str | None) -> Caller:
    """The caller sending these ``Bearer`` credentials: what :func:`caller` answers, for a request
    served without FastAPI's dependencies (``runs.SubmitShortcut``)."""
    if not services.config.auth:
        return Caller(tenant=None, key_id=None)
    if credentials is None or not credentials.strip():
        raise ApiError(
            401, "unauthorized", "send an API key as 'Authorization: Bearer <key>'", headers=_CHALLENGE
        )
    address = services.tenants.record_key(credentials.strip())
    record = live_record(await _get(services, address)) if address is not None else None
    if record is None:
        raise ApiError(401, "unauthorized", "the API key is unknown or revoked", headers=_CHALLENGE)
    return Caller(tenant=record.tenant, key_id=record.id)


async def _get(services: Services, key: str) -> str | None:
    """``GET key`` on the event loop's kept connections (a single Redis: they skip the pool's
    per-command work), else on the asyncio client."""
    loop = services.loop_connections
    raw = await (loop.execute("GET", key) if loop is not None else services.aredis.get(key))
    return None if raw is None else str(raw)


class LoopbackOnly:
    """ASGI middleware of an app with authentication off: every request is refused (403) unless it
    arrived on a loopback address from a loopback address.

    The address the server is bound to cannot be known from inside the app: the lifespan runs
    before uvicorn binds, and uvicorn may have been started by anyone (``uvicorn --factory
    producer.api.app:create_app --host 0.0.0.0``) with any environment, so what ``wesichain api`` says about
    its ``--host`` (``WESICHAIN_API_HOST``, which ``ApiConfig`` checks) is only an early refusal
    with a clear message. Each connection does show where it actually arrived:
    ``scope["server"]`` is the local address of its socket, and ``scope["client"]`` the peer's
    (or, behind a proxy uvicorn trusts, the client the proxy names). A request is served only if
    both are loopback:

    - bound to a public address, the local address is that address: nothing is served;
    - bound to all addresses (0.0.0.0, ::), a request from another host arrives on a public address
      and is refused, one from this host to 127.0.0.1 is served; so the server answers exactly
      those a loopback bind would;
    - a forwarded client address cannot let a remote caller in, as it does not change the local
      address its connection arrived on; and a proxy on this host forwarding someone else's request
      names that someone, who is refused.

    A connection whose addresses the server does not give (a Unix socket) is refused as well.

    The request must also name this host as a loopback one (``Host: localhost``, ``127.0.0.1`` or
    ``[::1]``, with any port): a web page whose own name an attacker rebinds to 127.0.0.1 (DNS
    rebinding) sends its requests from and to loopback, from the developer's own browser, but
    under its own name, and would otherwise read and act as the operator."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._warned = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self._local(scope):
            await self.app(scope, receive, send)
            return
        if not self._warned:  # once: a flood of refused requests must not flood the log
            self._warned = True
            _log.warning(
                "authentication is off: refusing requests that are not from and to loopback"
                " (this one arrived on %s from %s); bind to 127.0.0.1 or turn authentication on",
                _host(scope.get("server")),
                _host(scope.get("client")),
            )
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        response = error_response(
            403,
            "forbidden",
            "authentication is off, so this server answers only callers on its own host over a"
            " loopback address; use an API key on a server with authentication on",
        )
        await response(scope, receive, send)

    @staticmethod
    def _local(scope: Scope) -> bool:
        return (
            _loopback(_host(scope.get("server")))
            and _loopback(_host(scope.get("client")))
            and _names_loopback(scope)
        )


def _names_loopback(scope: Scope) -> bool:
    """Whether the request's ``Host`` names this host by a loopback name (none given: HTTP/1.0,
    which no browser sends)."""
    for name, value in scope.get("headers") or ():
        if name == b"host":
            host = value.decode("latin-1").strip().lower()
            if host.startswith("["):  # [::1]:8000
                host = host[1 : host.find("]")] if "]" in host else ""
            elif host.count(":") == 1:  # 127.0.0.1:8000, localhost:8000
                host = host.split(":", 1)[0]
            return host in ("localhost", "localhost.") or _loopback(host)
    return True


def _host(address: object) -> str:
    """The host of an ASGI ``server`` or ``client`` pair ("" when there is none)."""
    if isinstance(address, (tuple, list)) and address and isinstance(address[0], str):
        return address[0]
    return ""


def _loopback(host: str) -> bool:
    # 127.0.0.1 arriving on a dual-stack socket reads ::ffff:127.0.0.1, which Python before 3.13
    # does not call loopback.
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # "localhost" or a name: a socket's address is never one
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback
