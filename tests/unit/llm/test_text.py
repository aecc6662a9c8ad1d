"""Well-formed text from what providers send: UTF-16 halves joined across pieces, lone
surrogates replaced, in text, in decoded JSON values and in JSON text."""

from __future__ import annotations

import json

import pytest

from shared.llm.text import SurrogateJoiner, clean_json_text, clean_text, clean_value

EMOJI = "🌍"
HIGH, LOW = "\ud83c", "\udf0d"  # the UTF-16 halves of EMOJI


def join(pieces: list[str]) -> list[str]:
    joiner = SurrogateJoiner()
    return [joiner.feed(piece) for piece in pieces] + [joiner.finish()]


@pytest.mark.parametrize(
    ("pieces", "expected"),
    [
        (["ab", "cd"], ["ab", "cd", ""]),
        ([f"a{HIGH}", f"{LOW}b"], ["a", f"{EMOJI}b", ""]),  # the halves travel apart
        ([HIGH, LOW], ["", EMOJI, ""]),
        ([HIGH, "", LOW], ["", "", EMOJI, ""]),  # an empty piece in between changes nothing
        ([f"{HIGH}{LOW}"], [EMOJI, ""]),
        ([f"a{HIGH}", "b"], ["a", "\ufffdb", ""]),  # a first half whose partner never comes
        ([f"{LOW}a"], ["\ufffda", ""]),  # a second half alone
        ([f"a{HIGH}"], ["a", "\ufffd"]),  # the text ends after a first half
        ([HIGH, HIGH, LOW], ["", "\ufffd", EMOJI, ""]),
    ],
)
def test_joiner(pieces: list[str], expected: list[str]) -> None:
    assert join(pieces) == expected
    for text in expected:
        text.encode("utf-8")  # never a lone surrogate


def test_joiner_passes_plain_pieces_through_as_they_are() -> None:
    joiner = SurrogateJoiner()
    piece = "Grüße 東京"
    assert joiner.feed(piece) is piece


def test_clean_text() -> None:
    assert clean_text(f"a{HIGH}b{LOW}c{EMOJI}") == f"a\ufffdb\ufffdc{EMOJI}"
    plain = "no surrogates 🌍"
    assert clean_text(plain) is plain


def test_clean_value_cleans_every_string_keys_included() -> None:
    value = {HIGH: [LOW, 1, {"k": f"x{HIGH}"}], "n": None, "b": True}
    assert clean_value(value) == {"\ufffd": ["\ufffd", 1, {"k": "x\ufffd"}], "n": None, "b": True}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r'{"a": "\ud83c"}', r'{"a": "\ufffd"}'),  # a lone first half
        (r'{"a": "\udf0d"}', r'{"a": "\ufffd"}'),  # a lone second half
        (r'{"a": "\ud83c\udf0d"}', r'{"a": "\ud83c\udf0d"}'),  # a pair: kept
        (r'{"a": "\uD83C\uDF0D"}', r'{"a": "\uD83C\uDF0D"}'),  # upper-case hex too
        (r'{"a": "\ud83c\ud83c\udf0d"}', r'{"a": "\ufffd\ud83c\udf0d"}'),
        (r'{"a": "\\ud83c"}', r'{"a": "\\ud83c"}'),  # an escaped backslash, then plain text
        (r'{"a": "\\\ud83c"}', r'{"a": "\\\ufffd"}'),  # an escaped backslash, then an escape
        (r'{"a": "\u00fc\n"}', r'{"a": "\u00fc\n"}'),
        ('{"a": "\ud83c"}', '{"a": "\ufffd"}'),  # a lone surrogate character, not an escape
    ],
)
def test_clean_json_text(text: str, expected: str) -> None:
    cleaned = clean_json_text(text)
    assert cleaned == expected
    json.dumps(json.loads(cleaned), ensure_ascii=False).encode("utf-8")
