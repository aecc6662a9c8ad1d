"""The memory store's rules on the in-process Redis stand-in: checks, write ids applied once,
search by text and filter in namespace order, namespace listing, quota, a call's bounded writes."""

from __future__ import annotations

import fakeredis
import pytest

from shared.call_memory import CallMemory
from shared.errors import InvalidRequest
from shared.keys import Keys
from shared.memory import MAX_WRITES_PER_CALL, Memory, MemoryFull
from shared.state import MemoryWrite


def _memory(tenant: str | None = "acme", quota: int = 100) -> Memory:
    return Memory(fakeredis.FakeRedis(decode_responses=True), Keys(), tenant, lambda: quota)


def test_a_write_id_is_applied_once() -> None:
    memory = _memory()
    write = MemoryWrite(op="put", namespace=["a"], key="k", value={"x": 1}, write_id="r:1:c:0")
    assert memory.apply([write]) == ["put"]
    assert memory.apply([write.model_copy(update={"value": {"x": 2}})]) == ["duplicate"]
    item = memory.get(["a"], "k")
    assert item is not None and item.value == {"x": 1} and item.version == 1


def test_search_by_text_and_filter_in_namespace_and_key_order() -> None:
    memory = _memory()
    memory.put(["u", "b"], "2", {"text": "Green tea", "kind": "fact"})
    memory.put(["u", "a"], "1", {"text": "green apples", "kind": "wish"})
    memory.put(["v"], "3", {"text": "green"})
    found = memory.search(["u"], query="GREEN")
    assert [(i.namespace, i.key) for i in found.items] == [(["u", "a"], "1"), (["u", "b"], "2")]
    assert [i.key for i in memory.search(["u"], filter={"kind": "fact"}).items] == ["2"]
    assert [i.key for i in memory.search([], query="green", offset=1, limit=1).items] == ["2"]
    assert memory.list_namespaces() == [("u", "a"), ("u", "b"), ("v",)]
    assert memory.list_namespaces(max_depth=1) == [("u",), ("v",)]
    assert memory.list_namespaces(prefix=["u"]) == [("u", "a"), ("u", "b")]


def test_tenants_do_not_share_items() -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    mine, theirs = (Memory(client, Keys(), t, lambda: 10) for t in ("acme", "other"))
    mine.put(["a"], "k", {"x": 1})
    assert theirs.get(["a"], "k") is None and theirs.search().items == [] and not theirs.delete(["a"], "k")
    assert theirs.list_namespaces() == [] and mine.get(["a"], "k") is not None


def test_the_quota_counts_new_items_only() -> None:
    memory = _memory(quota=1)
    memory.put(["a"], "k", {"x": 1})
    assert memory.put(["a"], "k", {"x": 2}).version == 2
    with pytest.raises(MemoryFull):
        memory.put(["a"], "other", {"x": 1})
    assert memory.count() == 1


@pytest.mark.parametrize(
    ("namespace", "key", "value"),
    [
        ([], "k", {}),
        (["a/b"], "k", {}),
        (["a"] * 9, "k", {}),
        (["a"], "", {}),
        (["a"], "k\n", {}),
        (["a"], "k", [1]),
    ],
)
def test_bad_input_is_refused_and_nothing_written(namespace: list[str], key: str, value: object) -> None:
    memory = _memory()
    with pytest.raises(InvalidRequest):
        memory.put(namespace, key, value)  # type: ignore[arg-type]
    assert memory.count() == 0


def test_a_calls_writes_are_held_and_bounded() -> None:
    memory = _memory()
    call = CallMemory(lambda: memory, "run:1:c")
    call.put(["a"], "k", {"x": 1})
    call.delete(["a"], "gone")
    assert memory.get(["a"], "k") is None  # held until the result is recorded
    assert [(w.op, w.write_id) for w in call.pending] == [("put", "run:1:c:0"), ("delete", "run:1:c:1")]
    for n in range(MAX_WRITES_PER_CALL - 2):
        call.put(["a"], f"k{n}", {})
    with pytest.raises(InvalidRequest):
        call.put(["a"], "one-too-many", {})
    assert memory.apply(call.pending)[:2] == ["put", "absent"]
