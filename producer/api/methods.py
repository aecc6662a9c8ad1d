"""HTTP methods as RFC 9110 has them: HEAD wherever GET is served, and a 405's ``Allow`` naming
every method of the resource.

FastAPI's routes serve only the methods they declare, so HEAD, which every general-purpose server
must support (RFC 9110 §9.1), was a 405 on every path; and Starlette's 405 names only the methods
of the first route whose path matched (``Allow: POST`` for ``/v1/runs``, which GET serves too)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["HeadAsGet", "allowed_methods"]


#: The methods a route of the API may serve (HEAD goes with GET).
_METHODS = ("DELETE", "GET", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> list[str]:
    """The methods some route serves at the request's path (with HEAD wherever GET is)."""
    # The path as the app's router saw it (a mount, the console's, moves the root path on).
    scope = {
        **request.scope,
        "root_path": request.scope.get("app_root_path", request.scope.get("root_path", "")),
    }
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Mount):
            # Static files (the console's): they serve GET and HEAD, whatever the method asked.
            if route.matches(scope)[0] is not Match.NONE:
                methods.add("GET")
            continue
        methods.update(m for m in _METHODS if route.matches({**scope, "method": m})[0] is Match.FULL)
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


_DISCONNECT: Message = {"type": "http.disconnect"}


class HeadAsGet:
    """ASGI middleware: a HEAD request is served as the GET it would be, and its answer ends with
    its head. The server (uvicorn) sends no body for a HEAD; here a streamed answer (an event
    stream) also ends there: the app is told the client went away once the head is out, so it does
    not go on producing a body nobody reads."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        done = asyncio.Event()

        async def send_head(message: Message) -> None:
            if done.is_set():
                return
            if message["type"] == "http.response.body":
                done.set()
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        async def receive_until_done() -> Message:
            if done.is_set():
                return _DISCONNECT
            received = asyncio.ensure_future(receive())
            ended = asyncio.ensure_future(done.wait())
            await asyncio.wait({received, ended}, return_when=asyncio.FIRST_COMPLETED)
            ended.cancel()
            if received.done():
                return received.result()
            received.cancel()
            return _DISCONNECT

        await self.app({**scope, "method": "GET"}, receive_until_done, send_head)
