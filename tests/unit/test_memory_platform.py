"""Memory's semantic search (a deterministic toy embedding), vectors dropped with their items, and
a middleware's put past the quota refused before anything is written."""

from __future__ import annotations

import logging

import fakeredis
import pytest

from shared.call_memory import PhaseMemory
from shared.embedding import load_embedding, pack_vector, unpack_vector
from shared.errors import ConfigError, InvalidRequest
from shared.keys import Keys
from shared.memory import Memory, MemoryFull
from tests.toy_embedding import letters


def _memory(embed: bool = True, quota: int = 100) -> Memory:
    return Memory(
        fakeredis.FakeRedis(decode_responses=True), Keys(), "acme", lambda: quota, letters if embed else None
    )


def test_a_semantic_search_ranks_by_cosine_similarity() -> None:
    memory = _memory()
    memory.put(["notes"], "a", {"text": "zzzz"})
    memory.put(["notes"], "b", {"text": "apple"})
    memory.put(["notes"], "c", {"text": "apples and pears"})
    memory.put(["other"], "d", {"text": "apple"})
    found = memory.search(["notes"], query="apple", semantic=True)
    assert [i.key for i in found.items] == ["b", "c", "a"]
    scores = [i.score for i in found.items if i.score is not None]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)
    assert memory.search(["notes"], query="apple", semantic=True, limit=1, offset=1).items[0].key == "c"
    # A text search is unchanged: no score.
    assert [(i.key, i.score) for i in memory.search(["notes"], query="apple").items] == [
        ("b", None),
        ("c", None),
    ]


def test_items_without_a_vector_are_left_out_and_a_delete_drops_the_vector() -> None:
    memory = _memory()
    plain = Memory(memory.redis, memory.keys, "acme", memory.quota, None)
    plain.put(["n"], "unembedded", {"text": "apple"})
    memory.put(["n"], "embedded", {"text": "apple"})
    assert [i.key for i in memory.search(["n"], query="apple", semantic=True).items] == ["embedded"]
    vectors = memory.keys.memory("acme", "vectors")
    assert memory.redis.hexists(vectors, "n\x1f\x1eembedded")  # namespace, separator, end, key
    assert memory.delete(["n"], "embedded")
    assert memory.redis.hlen(vectors) == 0
    # Rewritten where no embedding is configured: the old value's vector goes.
    memory.put(["n"], "again", {"text": "apple"})
    plain.put(["n"], "again", {"text": "pear"})
    assert memory.redis.hlen(vectors) == 0


def test_semantic_search_needs_an_embedding_and_a_query() -> None:
    with pytest.raises(InvalidRequest, match="WESICHAIN_MEMORY_EMBEDDING"):
        _memory(embed=False).search([], query="x", semantic=True)
    with pytest.raises(InvalidRequest, match="needs a query"):
        _memory().search([], query=" ", semantic=True)


def test_vectors_are_checked_and_normalised() -> None:
    assert unpack_vector(pack_vector([3.0, 4.0])) == pytest.approx((0.6, 0.8))
    for bad in ([], [0.0, 0.0], [float("nan")], "abc", [True]):
        with pytest.raises(InvalidRequest):
            pack_vector(bad)  # type: ignore[arg-type]
    assert unpack_vector("not base64!") == ()
    assert load_embedding("") is None
    assert load_embedding("tests.toy_embedding:letters") is letters
    for spec in ("nocolon", "tests.nowhere:f", "tests.toy_embedding:absent", "tests.toy_embedding:__all__"):
        with pytest.raises(ConfigError):
            load_embedding(spec)


def test_a_failing_embedding_stores_the_item_without_a_vector(caplog: pytest.LogCaptureFixture) -> None:
    def broken(text: str) -> list[float]:
        raise RuntimeError(f"secret {text}")

    memory = Memory(fakeredis.FakeRedis(decode_responses=True), Keys(), "acme", lambda: 10, broken)
    with caplog.at_level(logging.WARNING, "wesichain.memory"):
        item = memory.put(["n"], "k", {"text": "private words"})
    assert item.version == 1 and memory.get(["n"], "k") is not None
    assert "RuntimeError" in caplog.text and "private" not in caplog.text


def test_a_middleware_put_past_the_quota_is_refused_before_writing(caplog: pytest.LogCaptureFixture) -> None:
    memory = _memory(quota=1)
    memory.put(["n"], "first", {"x": 1})
    phase = PhaseMemory(lambda: memory, "run:v3:before_model")
    with caplog.at_level(logging.WARNING, "wesichain.memory"), pytest.raises(MemoryFull):
        phase.put(["n"], "second", {"x": 2})
    assert caplog.text == ""  # refused up front: no write dropped in the script
    assert memory.count() == 1 and memory.get(["n"], "second") is None
    # The refused write kept its id: the next write of the hook is the second, as on a re-run.
    phase.delete(["n"], "first")
    assert [w.write_id for w in phase.pending] == ["run:v3:before_model:0", "run:v3:before_model:1"]
    assert memory.get(["n"], "first") is None
