"""Bytes to text and text to stream items: UTF-8, lines, server-sent events, NDJSON.

Networks and proxies cut a body anywhere: inside an event, a JSON object, a CRLF or a multi-byte
character. Everything here buffers across chunk boundaries. Bytes are decoded by one incremental
UTF-8 decoder per body, so a character cut between two chunks is decoded whole once its last
byte arrives; bytes that are not UTF-8 at all become U+FFFD, as the server-sent events spec
prescribes and the providers' own SDKs do, and the decoder never yields a lone surrogate.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shared.errors import excerpt

__all__ = [
    "LineSplitter",
    "NdjsonParser",
    "SseEvent",
    "SseParser",
    "StreamDecodeError",
    "Utf8Decoder",
    "decode_utf8",
]


class StreamDecodeError(ValueError):
    """A stream's framing or payload is broken. ``truncated`` says it merely ended mid-item."""

    def __init__(self, message: str, *, truncated: bool = False) -> None:
        super().__init__(message)
        self.truncated = truncated


class Utf8Decoder:
    """Decodes one body's bytes, chunk by chunk, to text.

    A character whose bytes are split between chunks comes out whole with the chunk that
    completes it; invalid bytes, and an incomplete character at the very end, become U+FFFD.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return str(self._decoder.decode(data))

    def finish(self) -> str:
        return str(self._decoder.decode(b"", final=True))


def decode_utf8(data: bytes) -> str:
    """A whole body as text, with the same rules as :class:`Utf8Decoder`."""
    decoder = Utf8Decoder()
    return decoder.feed(data) + decoder.finish()


class LineSplitter:
    """Splits a byte stream into lines ending in CRLF, LF or CR, across chunk boundaries.

    The bytes are decoded first, by one :class:`Utf8Decoder` for the whole stream, so a
    multi-byte character cut between chunks is reassembled before any line is split. Text
    without a line ending is only collected, so a long line costs linear time however it is cut.
    With ``max_chars``, a line longer than that raises :class:`StreamDecodeError` as soon as it is
    (a stream that never ends its line holds at most that much, and the chunk that crossed it).
    """

    _EOL = re.compile(r"\r\n|\r|\n")
    _ANY_EOL = re.compile(r"[\r\n]")

    def __init__(self, max_chars: int | None = None) -> None:
        self._decoder = Utf8Decoder()
        self._parts: list[str] = []  # the current line so far; it holds no line ending but a last CR
        self._held = 0  # characters in _parts
        self._ends_in_cr = False
        self.max_chars = max_chars

    def feed(self, data: bytes) -> list[str]:
        return self._split(self._decoder.feed(data))

    def finish(self) -> tuple[list[str], str | None]:
        """Complete lines still held (a final lone CR) and the unterminated rest, if any."""
        lines = self._split(self._decoder.finish())
        rest = "".join(self._parts)
        self._parts, self._held, self._ends_in_cr = [], 0, False
        if rest.endswith("\r"):
            lines.append(rest[:-1])
            rest = ""
        return lines, rest or None

    def _split(self, text: str) -> list[str]:
        if not self._ends_in_cr and not self._ANY_EOL.search(text):
            if text:
                self._parts.append(text)
                self._held += len(text)
                self._check(self._held)
            return []
        buf = "".join(self._parts) + text
        lines: list[str] = []
        start = 0
        for match in self._EOL.finditer(buf):
            if match.group() == "\r" and match.end() == len(buf):
                break  # maybe the first half of a CRLF: wait for the next character
            self._check(match.start() - start)
            lines.append(buf[start : match.start()])
            start = match.end()
        rest = buf[start:]
        self._check(len(rest) - rest.endswith("\r"))
        self._parts, self._held = ([rest], len(rest)) if rest else ([], 0)
        self._ends_in_cr = rest.endswith("\r")
        return lines

    def _check(self, length: int) -> None:
        if self.max_chars is not None and length > self.max_chars:
            raise StreamDecodeError(f"a line of the stream is longer than {self.max_chars} characters")


@dataclass(frozen=True)
class SseEvent:
    """One Server-Sent Event: its event name and data."""

    event: str = "message"
    data: str = ""
    id: str | None = None


@dataclass
class SseParser:
    """Server-sent events as the WHATWG spec frames them: fields per line, blank line dispatches,
    ``:`` comments skipped (or handed to ``on_comment``), multi-line ``data`` joined with newlines.

    The one SSE parser of the code base: the model providers' streams, the API clients' run event
    streams and the tests' reading of the API's streams all go through it.

    With ``max_chars``, a line, or an event's data (its ``data`` lines joined), longer than that
    raises :class:`StreamDecodeError`: a stream that never ends a line or an event holds no more."""

    #: Called with each comment's text (the API's ``: keep-alive``), for a reader that counts them.
    on_comment: Callable[[str], None] | None = None
    max_chars: int | None = None
    _lines: LineSplitter = field(default_factory=LineSplitter)
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _data_chars: int = 0
    _id: str | None = None
    _started: bool = False

    def __post_init__(self) -> None:
        self._lines.max_chars = self.max_chars

    def feed(self, chunk: bytes) -> list[SseEvent]:
        return [event for line in self._lines.feed(chunk) if (event := self._line(line)) is not None]

    def finish(self) -> list[SseEvent]:
        """Events completed by the last bytes. An event without its closing blank line is
        dropped, as the spec says: it may be cut short."""
        lines, _partial = self._lines.finish()
        return [event for line in lines if (event := self._line(line)) is not None]

    def _line(self, line: str) -> SseEvent | None:
        if not self._started:
            self._started = True
            line = line.removeprefix("\ufeff")
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            if self.on_comment is not None:
                self.on_comment(line[1:].strip())
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data_chars += len(value) + bool(self._data)  # the newline joining it
            if self.max_chars is not None and self._data_chars > self.max_chars:
                raise StreamDecodeError(f"an event of the stream is longer than {self.max_chars} characters")
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        return None

    def _dispatch(self) -> SseEvent | None:
        event = SseEvent(event=self._event or "message", data="\n".join(self._data), id=self._id)
        has_data = bool(self._data)
        self._event, self._data, self._data_chars = "", [], 0
        return event if has_data else None


@dataclass
class NdjsonParser:
    """Newline-delimited JSON: one value per line, blank lines ignored."""

    _lines: LineSplitter = field(default_factory=LineSplitter)

    def feed(self, chunk: bytes) -> list[Any]:
        return [_json_line(line) for line in self._lines.feed(chunk) if line.strip()]

    def finish(self) -> list[Any]:
        lines, rest = self._lines.finish()
        values = [_json_line(line) for line in lines if line.strip()]
        if rest is not None and rest.strip():
            try:
                values.append(json.loads(rest))
            except json.JSONDecodeError:
                raise StreamDecodeError(
                    f"stream ended inside a JSON line: {excerpt(rest, 200)}", truncated=True
                ) from None
        return values


def _json_line(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise StreamDecodeError(f"malformed JSON line ({exc.msg}): {excerpt(line, 200)}") from None
