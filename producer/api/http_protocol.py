"""The API server's HTTP/1.1 connections: uvicorn's h11 protocol with a deadline for a request's head.

uvicorn bounds the size of a request's head (h11's 16 KiB) but not the time it may take: a client
that opens a connection and sends nothing, or sends its request line and headers a byte now and
then (slowloris), holds the connection (a socket, a file descriptor, a protocol object) for as
long as it likes, and enough such clients take every descriptor the process has. Here a request's
head must arrive whole within ``head_timeout_s`` (``WESICHAIN_API_HEAD_TIMEOUT_S``, ``wesichain
api --head-timeout``) of the connection's opening, or, on a kept-alive connection, of the first
byte after the previous answer (until that byte, uvicorn's keep-alive timeout holds). A head
begun and not finished in time is answered 408 in the API's error shape and the connection
closed; a connection on which nothing was sent is closed without an answer, as an idle kept-alive
one is. The body has its own deadline (``body_limit.py``).

A head h11 cannot read (a malformed request line or header, a ``Content-Length`` that is no
number, two that differ, a head past h11's 16 KiB) is answered in the API's error shape too, not
uvicorn's plain text: ``400 bad_request``, ``431 headers_too_large`` for a head too long, or ``501
not_implemented`` for a transfer coding other than chunked, and the connection closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
from functools import cache
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from producer.api.config import head_timeout_from_env

__all__ = ["HeadDeadline"]

log = logging.getLogger("wesichain.api")


@cache
def _head_timeout_s() -> float:
    return head_timeout_from_env()


#: Where h11 starts quoting the request's own bytes in its message (``illegal header line:
#: bytearray(b'...')``, ``Illegal header value b'...'``).
_QUOTED = re.compile(r"[:\s]*(bytearray\(|b'|b\")")


def _reason(refused: BaseException | None) -> str:
    """What h11 found wrong with a head, without the bytes it quotes: the line it refused may be
    the Authorization header, and an error answer is no place to repeat a key (or anything else
    the client sent; proxies and clients log error answers)."""
    if refused is None:
        return "malformed"
    return _QUOTED.split(str(refused), maxsplit=1)[0][:200] or "malformed"


class HeadDeadline(H11Protocol):
    """uvicorn's h11 connection, cut off when a request's head does not arrive in time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout_s = _head_timeout_s()
        self._head_due: asyncio.TimerHandle | None = None
        #: Whether a byte of the awaited head came (then a late head is answered 408).
        self._head_begun = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._awaiting_head():
            if self._head_due is None:
                self._arm()  # the first byte after an answer: the keep-alive wait is over
            self._head_begun = self._head_begun or bool(data)
        super().data_received(data)
        self._settle()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request whose head came already
        self._settle()
        if self._awaiting_head() and self.conn.trailing_data[0] and self._head_due is None:
            self._arm()  # part of the next head came with the last request: its clock runs
            self._head_begun = True

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a head h11 refused (it calls this while handling h11's error, which
        says whether the head was too long): in the API's error shape."""
        refused = sys.exc_info()[1]
        hint = refused.error_status_hint if isinstance(refused, h11.RemoteProtocolError) else 400
        if hint == 431:
            status, kind, message = 431, "headers_too_large", "the request's line and headers are too long"
        elif hint == 501:
            # A transfer coding other than chunked (RFC 9112 §6.1: 501, the server does not do it).
            status, kind = 501, "not_implemented"
            message = "a request body is taken with a Content-Length or as one Transfer-Encoding: chunked"
        else:
            reason = _reason(refused)
            status, kind, message = 400, "bad_request", f"the request's head is not valid HTTP/1.1: {reason}"
        self._answer_and_close(status, kind, message, {})

    def _answer_and_close(self, status: int, kind: str, message: str, details: dict[str, Any]) -> None:
        """Write an error answer by hand (no request reached the app) and close the connection."""
        body = json.dumps({"error": {"kind": kind, "message": message, "details": details}}).encode()
        phrase = {
            400: "Bad Request",
            408: "Request Timeout",
            431: "Request Header Fields Too Large",
            501: "Not Implemented",
        }[status]
        head = (
            f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.close()

    def _awaiting_head(self) -> bool:
        """No request is being served: what comes now is the next request's head."""
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._head_begun = False
        self._head_due = self.loop.call_later(self.head_timeout_s, self._head_late)

    def _disarm(self) -> None:
        if self._head_due is not None:
            self._head_due.cancel()
            self._head_due = None

    def _settle(self) -> None:
        if not self._awaiting_head():
            self._disarm()  # the head came whole: the request is the app's (and the body's deadline)

    def _head_late(self) -> None:
        self._head_due = None
        if self.transport.is_closing() or not self._awaiting_head():
            return
        if self._head_begun:
            timeout = self.head_timeout_s
            log.info("closed a connection of %s: its request's head was late (%g s)", self.client, timeout)
            self._answer_and_close(
                408,
                "request_timeout",
                f"the request's line and headers did not arrive within {timeout:g} s",
                {"timeout_s": timeout},
            )
            return
        self.transport.close()
