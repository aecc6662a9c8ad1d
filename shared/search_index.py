"""The listing indexes a run is in, which its creation enters it in.

Every worker creates runs (a sub-run, a pipeline's step, a callback's new run), so it needs these;
the search query itself (``shared/search.py``) is the API's and the client's, apart so that a
worker does not carry its models.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from shared.state import RunHead

__all__ = ["MAX_SEARCH_VALUE_CHARS", "index_dimensions", "meta_value", "searchable_value"]

#: A declared key's value is indexed when it is a string of at most this many characters.
MAX_SEARCH_VALUE_CHARS = 256


def searchable_value(value: Any) -> str | None:
    """A metadata value as its index holds it: a string within the bound; anything else is not
    indexed (None)."""
    if isinstance(value, str) and 0 < len(value) <= MAX_SEARCH_VALUE_CHARS:
        return value
    return None


def meta_value(key: str, value: str) -> str:
    """The value of a run's index entry for metadata ``key`` = ``value``."""
    return f"{key}={value}"


def index_dimensions(head: RunHead, declared: Iterable[str]) -> list[tuple[str, str]]:
    """Every listing index a run is in, as (dimension, value): all of its tenant's, its agent's,
    its status's, its thread's, and one per declared metadata key with a searchable value."""
    dimensions = [("all", ""), ("agent", head.agent), ("status", head.status)]
    if head.thread_id is not None:
        dimensions.append(("thread", head.thread_id))
    metadata: Mapping[str, Any] = head.metadata
    for key in declared:
        value = searchable_value(metadata.get(key))
        if value is not None:
            dimensions.append(("meta", meta_value(key, value)))
    return dimensions
