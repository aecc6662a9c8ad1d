"""The request target as RFC 9112 has it: a request in absolute-form is served, and a path with
a slash too many or too few is redirected without trusting the client's ``Host``.

A server must accept a target in absolute-form (``GET http://host/v1/runs HTTP/1.1``, RFC 9112
§3.2.2), as a proxy or an older client may send it. uvicorn's h11 protocol (the one ``wesichain
api`` serves) hands the whole target to the app as its path, so every such request was a 404. The
host the target names is the request's host, whatever ``Host`` says: the loopback guard of an API
without authentication checks that host, so a target naming another cannot pass it with a
``Host: 127.0.0.1``.

Starlette redirects ``/v1/runs/`` to ``/v1/runs`` with a ``Location`` built from the request's
``Host`` header: an absolute URL naming any host a client chose, which a cache in front of the API
may keep and hand to others. The API redirects with the path alone (RFC 9110 §10.2.2 allows a
relative reference), so the client stays on the host it reached.
"""

from __future__ import annotations

from urllib.parse import unquote

from starlette.requests import Request
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["OriginForm", "slash_twin"]


_SCHEMES = (b"http://", b"https://")


class OriginForm:
    """ASGI middleware: a request whose target is in absolute-form is served as its origin-form
    (the path and query the target holds), with the target's authority as its ``Host``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            root = scope.get("root_path", "").encode("ascii", "replace")
            raw: bytes = scope.get("raw_path") or b""
            target = raw[len(root) :] if raw.startswith(root) else raw
            if target[:8].lower().startswith(_SCHEMES):
                scope = _origin_form(scope, root, target)
        await self.app(scope, receive, send)


def _origin_form(scope: Scope, root: bytes, target: bytes) -> Scope:
    rest = target.split(b"://", 1)[1]
    authority, slash, path = rest.partition(b"/")
    # A target naming no host, or user information (deprecated, RFC 9110 §4.2.4), names no host
    # the guard could check: it keeps the path it came with, which no route matches.
    if not authority or b"@" in authority:
        return scope
    raw_path = b"/" + path if slash else b"/"
    headers = [(name, value) for name, value in scope["headers"] if name != b"host"]
    headers.append((b"host", authority))
    return {
        **scope,
        "path": scope.get("root_path", "") + unquote(raw_path.decode("ascii", "replace")),
        "raw_path": root + raw_path,
        "headers": headers,
    }


def slash_twin(request: Request) -> str | None:
    """Where a request that no route serves is served with one trailing slash fewer or more (as a
    relative reference, with its query), or None if it is not."""
    scope = request.scope
    root = scope.get("root_path", "")
    path: str = scope["path"][len(root) :] if scope["path"].startswith(root) else scope["path"]
    if path == "/" or scope["type"] != "http":
        return None
    if _routed(request, scope):
        return None  # a route took it and answered 404 itself (a file the console does not have)
    twin = path.rstrip("/") if path.endswith("/") else path + "/"
    # A Location starting "//" would name a host (a network-path reference): never one.
    if not twin or (root + twin).startswith("//") or not _routed(request, {**scope, "path": root + twin}):
        return None
    query = scope.get("query_string", b"").decode("latin-1")
    location: str = root + twin + (f"?{query}" if query else "")
    return location


def _routed(request: Request, scope: Scope) -> bool:
    return any(route.matches(scope)[0] is not Match.NONE for route in request.app.router.routes)
