"""A deterministic toy embedding for memory's semantic search tests: a text's letter counts
(``a``..``z``), so texts sharing letters are similar and the ranking is known in advance."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["letters"]


def letters(text: str) -> Sequence[float]:
    counts = [0.0] * 26
    for char in text.lower():
        if "a" <= char <= "z":
            counts[ord(char) - ord("a")] += 1.0
    counts[0] += 0.001  # never all zeros (a text without letters)
    return counts
