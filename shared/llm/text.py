"""Well-formed text out of what a provider sends: nothing here ever yields a lone surrogate.

Bytes are decoded by :class:`shared.llm.framing.Utf8Decoder`, which never produces surrogates.
JSON, however, can: ``\\ud83d`` is a valid JSON escape for half of a character outside the Basic
Multilingual Plane (most emoji), and a server that slices its text by UTF-16 code units (any
JavaScript string) sends the two halves of one emoji in two separate stream events. Decoded one
event at a time, each half is a lone surrogate, which no UTF-8 encoder accepts: an event holding
one cannot be serialised. So:

* :class:`SurrogateJoiner` joins the pieces of one streamed text (answer text, one tool call's
  argument text) so a character cut between two events arrives whole;
* :func:`clean_text` and :func:`clean_value` replace whatever lone surrogate is left with
  U+FFFD, as a UTF-8 decoder does with bytes that are not UTF-8;
* :func:`clean_json_text` does the same to ``\\uXXXX`` escapes inside JSON *text* (a tool call's
  arguments), which the runtime decodes later.
"""

from __future__ import annotations

import codecs
import re
from typing import Any

__all__ = ["REPLACEMENT", "SurrogateJoiner", "clean_json_text", "clean_text", "clean_value"]

REPLACEMENT = "\ufffd"

_SURROGATE = re.compile("[\ud800-\udfff]")
#: One JSON escape: a well-formed surrogate pair, a lone surrogate, or anything else (``\\\\``
#: included, so an escaped backslash before a ``u`` is never read as the start of an escape).
_JSON_ESCAPE = re.compile(
    r"\\(?:(?P<pair>u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    r"|(?P<lone>u[dD][89a-fA-F][0-9a-fA-F]{2})|.)",
    re.DOTALL,
)


def clean_text(text: str) -> str:
    """``text`` with every surrogate code point replaced by U+FFFD.

    In a Python string every surrogate is a lone one: a JSON decoder already combines a
    well-formed pair of escapes into one character.
    """
    return _SURROGATE.sub(REPLACEMENT, text) if _SURROGATE.search(text) else text


def clean_value(value: Any) -> Any:
    """A decoded JSON value with :func:`clean_text` applied to every string in it, keys included."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(k) if isinstance(k, str) else k: clean_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_value(item) for item in value]
    return value


def clean_json_text(text: str) -> str:
    """JSON text whose ``\\uXXXX`` escapes of lone surrogates are replaced by ``\\ufffd``
    (well-formed pairs are kept), and whose lone surrogate characters become U+FFFD."""
    text = clean_text(text)
    if "\\" not in text:
        return text
    return _JSON_ESCAPE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    return "\\ufffd" if match.group("lone") else match.group(0)


class SurrogateJoiner:
    """Joins successive pieces of one text, whose characters may be cut between UTF-16 halves.

    ``feed`` returns the text that is complete so far (a trailing first half waits for the next
    piece); ``finish`` returns what a first half left waiting at the end becomes (U+FFFD) or "".
    A half without its partner becomes U+FFFD. Pieces without surrogates pass through untouched.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-16-le")(errors="replace")

    def feed(self, piece: str) -> str:
        if not self._waiting() and not _SURROGATE.search(piece):
            return piece
        return str(self._decoder.decode(piece.encode("utf-16-le", "surrogatepass")))

    def finish(self) -> str:
        return str(self._decoder.decode(b"", final=True))

    def _waiting(self) -> bool:
        buffered, _ = self._decoder.getstate()
        return bool(buffered)
