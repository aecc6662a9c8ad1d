"""Optional vector search over long-term memory: the embedding function and the vectors it makes.

An operator names one function, ``WESICHAIN_MEMORY_EMBEDDING=package.module:function``, taking a
text and answering its embedding (a sequence of numbers, the same length for every text). Every
process that writes or searches memory and is given the setting uses it: the workers embed what
tools and middleware put, the API process what HTTP callers put, and each embeds the query of a
semantic search. An item written where the setting is not given has no vector and takes no part in
a semantic search until it is written again where it is.

A vector is kept normalised, as little-endian float32 in base64 text (the store's Redis clients
decode replies as text), beside its item (``shared/memory.py``), so
cosine similarity is a dot product. A semantic search ranks the items one search scans (a bounded
number: ``shared.memory.SCAN_ITEMS``): there is no approximate-nearest-neighbour index.
"""

from __future__ import annotations

import base64
import binascii
import functools
import importlib
import math
import struct
from collections.abc import Callable, Sequence

from shared.errors import ConfigError, InvalidRequest

__all__ = [
    "MAX_DIMENSIONS",
    "Embedding",
    "cosine",
    "load_embedding",
    "pack_vector",
    "unpack_vector",
]

#: A text's embedding: a sequence of floats, of one length for every text.
Embedding = Callable[[str], Sequence[float]]
#: The longest vector kept (4096 float32: 16 KiB per item).
MAX_DIMENSIONS = 4096


@functools.lru_cache(maxsize=8)
def load_embedding(spec: str) -> Embedding | None:
    """The function ``module:name`` names (None for ""); :class:`ConfigError` if it cannot be
    imported or is not callable."""
    if not spec:
        return None
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"WESICHAIN_MEMORY_EMBEDDING={spec!r}: expected package.module:function")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"WESICHAIN_MEMORY_EMBEDDING={spec!r}: {exc}") from None
    if not callable(found):
        raise ConfigError(f"WESICHAIN_MEMORY_EMBEDDING={spec!r} is not callable")
    embed: Embedding = found
    return embed


def pack_vector(values: Sequence[float]) -> str:
    """``values`` normalised, as base64 float32; :class:`InvalidRequest` unless it is 1 to
    MAX_DIMENSIONS finite numbers, not all zero."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise InvalidRequest("an embedding is a sequence of numbers")
    if not 1 <= len(values) <= MAX_DIMENSIONS:
        raise InvalidRequest(f"an embedding has 1 to {MAX_DIMENSIONS} numbers, not {len(values)}")
    floats: list[float] = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise InvalidRequest("an embedding holds finite numbers only")
        floats.append(float(value))
    norm = math.sqrt(sum(v * v for v in floats))
    if norm == 0.0:
        raise InvalidRequest("an embedding of all zeros has no direction")
    return base64.b64encode(struct.pack(f"<{len(floats)}f", *(v / norm for v in floats))).decode()


def unpack_vector(text: str | bytes) -> tuple[float, ...]:
    """A packed vector's numbers (none if it is not one)."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return ()
    return struct.unpack(f"<{len(raw) // 4}f", raw[: len(raw) // 4 * 4])


def cosine(a: Sequence[float], b: Sequence[float]) -> float | None:
    """The cosine similarity of two normalised vectors; None when their lengths differ (made by
    another embedding function)."""
    if len(a) != len(b):
        return None
    return sum(x * y for x, y in zip(a, b, strict=True))
