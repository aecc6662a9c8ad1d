"""Refuse request bodies the API must not take, before anything else reads them: a body over the
size limit (413), one that does not arrive within the read timeout (408), one whose framing is
ambiguous (400), one with a content coding (415), and JSON holding what JSON text cannot carry
(NaN, Infinity, a literal too large for a double, a lone UTF-16 surrogate) or nested past its
bound (422)."""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producer.api.errors import error_response, place_in
from shared.errors import InvalidRequest
from shared.request import MAX_JSON_DEPTH, check_json_depth

__all__ = ["MAX_BODY_DEPTH", "BodyLimit", "json_body_problems", "replaying"]

#: A declared length with more digits is over any limit (and is not handed to int()).
_MAX_LENGTH_DIGITS = 18


class BodyLimit:
    """ASGI middleware around the whole app (``create_app`` adds it last but for the loopback
    guard): it reads the body itself, counting the bytes as they arrive, and hands the app the body
    whole only once it is known to fit and to be acceptable.

    The headers are never taken at their word: a server may frame a body by Transfer-Encoding
    while it also carries a small Content-Length (h11, uvicorn's parser here, does exactly that), so
    a declared length is only a reason to refuse early, never a reason to stop counting.

    The whole body must arrive within ``timeout_s`` of the first read, however it is spread: a
    deadline for the body, not a wait between chunks, which a client sending a byte now and then
    would never reach. The server has no such limit of its own."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        framing, declared = self._framing(scope)
        if framing is not None:
            # RFC 9112 §6.1: a request with both headers may be smuggling another one; the
            # connection is closed after the answer, as its remaining bytes cannot be trusted.
            await self._answer(scope, receive, send, 400, "bad_request", framing, {}, close=True)
            return
        if declared > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        chunks: list[bytes] = []
        seen = 0
        more = True
        try:
            # One deadline for the whole body (``asyncio.wait_for`` around each read would start
            # a task per read, on every request).
            async with asyncio.timeout(self.timeout_s):
                while more:
                    message = await receive()
                    if message["type"] != "http.request":
                        return  # the client went away
                    chunk = message.get("body", b"")
                    seen += len(chunk)
                    if seen > self.max_bytes:
                        break
                    chunks.append(chunk)
                    more = message.get("more_body", False)
        except TimeoutError:
            await self._too_slow(scope, receive, send, seen)
            return
        if seen > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        body = b"".join(chunks)
        coding = self._coding(scope) if body else None
        if coding is not None:
            # RFC 9110 §12.5.3: a content coding the server does not take is a 415 naming the ones
            # it does. Read as it is, a compressed body would be taken for what it is not.
            refusal = f"the API takes request bodies without a content coding, not Content-Encoding: {coding}"
            await self._answer(
                scope,
                receive,
                send,
                415,
                "unsupported_media_type",
                refusal,
                {"content_encoding": coding},
                headers={"Accept-Encoding": "identity"},
            )
            return
        problems = json_body_problems(body)
        if problems:
            summary = "; ".join(f"{p['where']}: {p['problem']}" for p in problems[:5])
            details = {"problems": problems[:20]}
            await self._answer(scope, receive, send, 422, "invalid_request", summary, details)
            return
        await self.app(scope, replaying(body, receive), send)

    @staticmethod
    def _framing(scope: Scope) -> tuple[str | None, int]:
        """Why the body's framing headers are refused (None if they are not), and the length they
        declare (0 if none)."""
        lengths: set[bytes] = set()
        chunked = False
        for name, value in scope.get("headers", ()):
            if name == b"transfer-encoding":
                chunked = True
            elif name == b"content-length":
                lengths.update(part.strip() for part in value.split(b","))
        if chunked and lengths:
            return "a request may not carry both Content-Length and Transfer-Encoding", 0
        if not lengths:
            return None, 0
        if len(lengths) > 1:
            return "the request carries different Content-Length values", 0
        (length,) = lengths
        if not length.isdigit():  # ASCII digits only: no sign, no space, no other numerals
            return "the Content-Length is not a number", 0
        return None, int(length) if len(length) <= _MAX_LENGTH_DIGITS else 10**_MAX_LENGTH_DIGITS

    @staticmethod
    def _coding(scope: Scope) -> str | None:
        """The request's Content-Encoding unless it is none (or ``identity``)."""
        codings = [
            part.strip().decode("latin-1")[:40]
            for name, value in scope.get("headers", ())
            if name == b"content-encoding"
            for part in value.split(b",")
        ]
        taken = [c for c in codings if c and c.lower() != "identity"]
        return ", ".join(taken) if taken else None

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The rest of the body is not read: the connection is closed after the answer, or the
        # server would go on reading (and discarding) whatever the client still sends.
        await self._answer(
            scope,
            receive,
            send,
            413,
            "body_too_large",
            f"the request body is over {self.max_bytes} bytes",
            {"max_bytes": self.max_bytes},
            close=True,
        )

    async def _too_slow(self, scope: Scope, receive: Receive, send: Send, seen: int) -> None:
        # Closed after the answer like a body too large: what the client still sends is not read.
        await self._answer(
            scope,
            receive,
            send,
            408,
            "request_timeout",
            f"the request body did not arrive within {self.timeout_s:g} s ({seen} bytes did)",
            {"timeout_s": self.timeout_s, "received_bytes": seen},
            close=True,
        )

    async def _answer(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        status: int,
        kind: str,
        message: str,
        details: dict[str, Any],
        *,
        close: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:
        headers = {**({"Connection": "close"} if close else {}), **(headers or {})}
        await error_response(status, kind, message, details, headers or None)(scope, receive, send)


def replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` for an app handed a request whose body was read already: the body once,
    whole; after it, what the server says next (a disconnect)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class _NotFinite:
    """Where json.loads met a value the API cannot take as sent, and what is wrong with it."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem


#: An integer literal with more digits than this is past a double's range (1.8e308) whatever
#: they are; Python refuses past 4,300 digits, so such a token is never handed to int().
_MAX_DOUBLE_DIGITS = 309
#: The largest integer a double holds (any larger one reads as infinity as a double).
_MAX_DOUBLE_INT = int(sys.float_info.max)
#: A ``\uD800``..``\uDFFF`` escape: text holding one may decode to a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def _has_surrogate(text: str) -> bool:
    # json.loads joins a well-formed pair into one character: a surrogate left is a lone one.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


#: How deeply a request body may nest: its deepest free-form field (``MAX_JSON_DEPTH``) and the
#: objects that hold it.
MAX_BODY_DEPTH = MAX_JSON_DEPTH + 4


def json_body_problems(body: bytes) -> list[dict[str, str]]:
    """Each place a JSON ``body`` holds NaN, Infinity, -Infinity, a number too large for a double,
    a string (or key) with an unpaired UTF-16 surrogate, or a key twice in one object, as
    ``{"where", "problem"}`` in the shape of the API's validation errors (empty if there is none, or
    if the body is not JSON at all: the route answers that with its own error); or the one problem
    of a body nested deeper than ``MAX_BODY_DEPTH``.

    Python's json reads all of them: numbers as floats that are not finite, which pydantic then
    stores as null (the request would be taken with data other than the client sent),
    ``"\\ud800"`` as a string no UTF-8 encoder takes, which fails wherever it is stored or echoed,
    and a repeated key as its last value, where other parsers (a gateway that checked the request
    before it came here) may take the first: the API would act on a request other than the one
    they passed."""
    if not body:
        return []
    reader = _Reader()
    try:
        text = body.decode(json.detect_encoding(body), "surrogatepass")  # as json.loads does
        document = json.loads(
            text,
            parse_constant=reader.constant,
            parse_float=reader.number,
            parse_int=reader.integer,
            object_pairs_hook=reader.object,
        )
    except RecursionError:  # nested past the parser's stack: far past the bound
        return [{"where": "body", "problem": _too_deep()}]
    except ValueError:  # not JSON (or not in a JSON encoding)
        return []
    try:
        # Free-form fields (metadata, state, memory values, updates) are bounded where they are
        # checked; a whole body that nests this deep is no request of the API's.
        check_json_depth("the request body", document, MAX_BODY_DEPTH)
    except InvalidRequest as exc:
        return [{"where": "body", "problem": exc.message}]
    # Escaped, or sent as the UTF-8 bytes of a surrogate (which json.loads decodes too).
    surrogates = _SURROGATE_ESCAPE.search(text) is not None or _has_surrogate(text)
    if not reader.found and not surrogates:
        return []
    return _problems(document, surrogates)


class _Repeated(dict[str, Any]):
    """An object read with a key more than once (its last value kept, as json.loads keeps it)."""

    def __init__(self, pairs: list[tuple[str, Any]], repeated: list[str]) -> None:
        super().__init__(pairs)
        self.repeated = repeated


class _Reader:
    """json.loads's hooks for the numbers JSON does not have and for objects that repeat a key;
    ``found`` once one was read."""

    def __init__(self) -> None:
        self.found = False

    def object(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        value = dict(pairs)
        if len(value) == len(pairs):
            return value
        self.found = True
        # Sets, not a list searched for each repeat: a body may repeat thousands of keys in one
        # object, and a search per repeat would hold the event loop for seconds.
        seen: set[str] = set()
        repeated: dict[str, None] = {}  # in the order they were first repeated
        for key, _ in pairs:
            if key in seen:
                repeated[key] = None
            seen.add(key)
        return _Repeated(pairs, list(repeated))

    def constant(self, token: str) -> _NotFinite:
        self.found = True
        return _NotFinite(f"{token} is not a JSON number; send a finite number, a string or null")

    def number(self, token: str) -> float | _NotFinite:
        value = float(token)
        if math.isfinite(value):
            return value
        self.found = True
        shown = token if len(token) <= 24 else f"{token[:12]}... ({len(token)} characters)"
        return _NotFinite(f"{shown} is too large for a JSON number (a double)")

    def integer(self, token: str) -> int | _NotFinite:
        digits = len(token.lstrip("-"))
        if digits <= _MAX_DOUBLE_DIGITS:
            value = int(token)
            if abs(value) <= _MAX_DOUBLE_INT:
                return value
        self.found = True
        shown = token if len(token) <= 24 else f"{token[:12]}... ({digits} digits)"
        return _NotFinite(f"{shown} is too large for a JSON number (a double)")


_LONE = "holds an unpaired UTF-16 surrogate (\\ud800 to \\udfff), which is not a Unicode character"


def _problems(document: Any, surrogates: bool) -> list[dict[str, str]]:
    """Where ``document`` holds a value json.loads was hooked to mark, or (with ``surrogates``) a
    string or key with an unpaired surrogate: depth first, in document order, without recursion
    (the nesting is the client's to choose)."""
    problems: list[dict[str, str]] = []
    # Each value with the place of what holds it and its key or index: a place is made when its
    # value is reached, not for all of an array's items at once.
    stack: list[tuple[str, str | int | None, Any]] = [("body", None, document)]
    while stack:
        holder, part, value = stack.pop()
        where = holder if part is None else place_in(holder, part)
        if isinstance(value, _NotFinite):
            problems.append({"where": where, "problem": value.problem})
        elif isinstance(value, str):
            if surrogates and _has_surrogate(value):
                problems.append({"where": where, "problem": f"the string {_LONE}"})
        elif isinstance(value, dict):
            if isinstance(value, _Repeated):
                problems.extend(
                    {"where": place_in(where, key), "problem": "the key is in its object more than once"}
                    for key in value.repeated
                )
            for key in reversed(list(value)):
                stack.append((where, key, value[key]))
                if surrogates and _has_surrogate(key):
                    stack.append((where, key, _NotFinite(f"the key {_LONE}")))
        elif isinstance(value, list):
            stack.extend((where, i, v) for i, v in reversed(list(enumerate(value))))
    return problems


def _too_deep() -> str:
    return f"the request body nests deeper than {MAX_BODY_DEPTH} levels of objects and arrays"
