"""Custom events from tools: names, JSON and size checked; count and rate bounded without failing
the tool; Redis trouble swallowed; and the append fenced in Redis by the call's claim."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest
import redis

from producer.render import render_event
from shared import events as ev
from shared import protocol
from shared.custom_events import CustomEmitter, TokenBucket, check_custom, void_attempts
from shared.settings import Limits
from shared.store import Claim, RunStore
from shared.tools import ToolContext
from tests.harness import RedisServer
from tests.store_support import make_store
from tests.unit.test_store import acting
from worker.testing.runs import CALLS, HOLDER, call_claim, record


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def emitter(
    write: Callable[[ev.Event], bool] | None = None, limits: Limits | None = None
) -> tuple[CustomEmitter, list[ev.Event], Clock]:
    written: list[ev.Event] = []
    clock = Clock()

    def keep(event: ev.Event) -> bool:
        written.append(event)
        return True

    e = CustomEmitter(
        write or keep,
        run_id="r1",
        step=2,
        call_id="c1",
        tool="fetch",
        attempt=1,
        limits=limits or Limits(),
        clock=clock,
    )
    return e, written, clock


# -- what a tool may emit -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "1st", "has space", "x" * 65, "<b>", "progress\n", None, 3])
def test_a_name_must_be_a_short_identifier(name: object) -> None:
    with pytest.raises(ValueError, match="short identifier"):
        check_custom(name, {}, 8192)


@pytest.mark.parametrize("name", ["ToolCompleted", "completed", "CUSTOMEVENT", "tokendelta"])
def test_a_runtime_event_name_is_reserved(name: str) -> None:
    with pytest.raises(ValueError, match="runtime event"):
        check_custom(name, {}, 8192)


@pytest.mark.parametrize("data", [object(), {1, 2}, b"bytes", math.nan, {"x": math.inf}])
def test_data_must_be_json_and_the_error_does_not_show_it(data: object) -> None:
    with pytest.raises(ValueError, match="must be JSON") as caught:
        check_custom("progress", data, 8192)
    assert repr(data) not in str(caught.value)


def test_data_is_bounded_in_bytes_of_json() -> None:
    assert check_custom("partial", "é" * 4000, 8192) == "é" * 4000  # 8002 bytes: within
    with pytest.raises(ValueError, match="8194 bytes of JSON, over the 8192"):
        check_custom("partial", "é" * 4096, 8192)
    with pytest.raises(ValueError, match="not valid Unicode"):
        check_custom("partial", "\ud800", 8192)


def test_data_is_stored_as_the_json_value_it_serialises_to() -> None:
    assert check_custom("p", {"t": (1, 2), 3: None}, 8192) == {"t": [1, 2], "3": None}


def test_a_context_without_an_emitter_checks_then_drops() -> None:
    ctx = ToolContext(run_id="r", step=1, call_id="c", deadline=0.0)
    assert ctx.emit("progress", {"done": 1}) is False
    with pytest.raises(ValueError):
        ctx.emit("Failed", {})


# -- bounds -------------------------------------------------------------------------------------


def test_the_token_bucket_allows_a_burst_then_the_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=2, burst=4, clock=clock)
    assert [bucket.take() for _ in range(5)] == [True] * 4 + [False]
    clock.now = 0.5
    assert [bucket.take() for _ in range(2)] == [True, False]
    clock.now = 100.0  # never more than the burst saved up
    assert sum(bucket.take() for _ in range(10)) == 4


def test_events_over_the_rate_are_dropped_and_counted_once_when_the_tool_returns() -> None:
    e, written, clock = emitter(limits=Limits(custom_events_per_s=5))
    sent = [e.emit("progress", {"i": i}) for i in range(25)]
    assert sent == [True] * 10 + [False] * 15  # a burst of twice the rate
    clock.now = 1.0
    assert e.emit("progress", {"i": 25}) is True
    e.finish()
    assert [w.kind for w in written] == ["CustomEvent"] * 11 + ["CustomEventsDropped"]
    dropped = written[-1]
    assert isinstance(dropped, ev.CustomEventsDropped)
    assert (dropped.call_id, dropped.tool, dropped.step, dropped.attempt, dropped.dropped) == (
        "c1",
        "fetch",
        2,
        1,
        15,
    )
    first = written[0]
    assert isinstance(first, ev.CustomEvent)
    assert (first.run_id, first.call_id, first.tool, first.attempt, first.name, first.data) == (
        "r1",
        "c1",
        "fetch",
        1,
        "progress",
        {"i": 0},
    )


def test_events_over_the_count_are_dropped() -> None:
    e, written, clock = emitter(limits=Limits(max_custom_events_per_call=3, custom_events_per_s=1000))
    assert [e.emit("progress", i) for i in range(5)] == [True] * 3 + [False] * 2
    e.finish()
    assert [w.kind for w in written] == ["CustomEvent"] * 3 + ["CustomEventsDropped"]


def test_nothing_dropped_writes_no_dropped_event() -> None:
    e, written, _ = emitter()
    e.emit("progress", 1)
    e.finish()
    assert [w.kind for w in written] == ["CustomEvent"]


def test_redis_trouble_never_reaches_the_tool_nor_the_log_the_content(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(event: ev.Event) -> bool:
        raise redis.ConnectionError("gone")

    e, _, _ = emitter(broken)
    assert e.emit("progress", {"secret": "tenant words"}) is False
    e.finish()  # its dropped event fails the same way, silently for the tool
    assert e.emitted == 0
    assert "tenant words" not in caplog.text and "ConnectionError" in caplog.text


def test_a_fenced_off_delivery_stops_trying() -> None:
    calls: list[ev.Event] = []

    def fenced(event: ev.Event) -> bool:
        calls.append(event)
        return False

    e, _, _ = emitter(fenced)
    assert [e.emit("progress", i) for i in range(3)] == [False] * 3
    e.finish()
    assert len(calls) == 1 and e.fenced  # one round trip learnt it; no dropped event after it


def test_void_attempts_is_the_highest_voided_attempt_per_call() -> None:
    def voided(call: str, attempt: int) -> ev.CustomEventsVoided:
        return ev.CustomEventsVoided(
            run_id="r", step=1, call_id=call, tool="t", attempt=attempt, reason="taken_over"
        )

    assert void_attempts([voided("a", 1), voided("a", 3), voided("a", 2), voided("b", 1)]) == {
        (1, "a"): 3,
        (1, "b"): 1,
    }


# -- the fence, in Redis --------------------------------------------------------------------------


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RunStore]:
    client = redis_server.client()
    yield make_store(client)
    client.close()


def _custom(run_id: str, n: int, attempt: int = 1) -> ev.CustomEvent:
    return ev.CustomEvent(
        run_id=run_id, step=1, call_id="a", tool="add", attempt=attempt, name="progress", data=n
    )


def _customs(store: RunStore, run_id: str) -> list[tuple[int, object]]:
    return [(e.attempt, e.data) for _, e in store.read_events(run_id) if isinstance(e, ev.CustomEvent)]


def test_only_the_delivery_holding_the_call_appends_and_nothing_after_its_result(store: RunStore) -> None:
    act = acting(store)
    run_id = act.head.run_id
    first = call_claim(store, act.head, "a")
    assert isinstance(first, Claim)
    assert store.emit_custom(run_id, 1, "a", first.token, _custom(run_id, 1))
    assert not store.emit_custom(run_id, 1, "a", "0123456789abcdef", _custom(run_id, 2))  # a forged token
    assert not store.emit_custom(run_id, 1, "b", first.token, _custom(run_id, 3))  # another call's
    # The sweeper hands the call on: the claim stays as a marker, and its holder is fenced off.
    field = protocol.call_claim(1, "a")
    store.redis.hset(store.keys.run(run_id), field, f"{first.token}|-1|{HOLDER}")
    assert not store.emit_custom(run_id, 1, "a", first.token, _custom(run_id, 4))
    second = call_claim(store, act.head, "a")
    assert isinstance(second, Claim) and second.prior == "expired" and second.attempts == 2
    assert not store.emit_custom(run_id, 1, "a", first.token, _custom(run_id, 5))
    assert store.emit_custom(run_id, 1, "a", second.token, _custom(run_id, 6, attempt=2))
    assert record(store, act, second, CALLS[0], "3") == "recorded"
    assert not store.emit_custom(run_id, 1, "a", second.token, _custom(run_id, 7, attempt=2))
    assert _customs(store, run_id) == [(1, 1), (2, 6)]


# -- the CLI's rendering --------------------------------------------------------------------------


def test_the_cli_renders_custom_events_on_one_line() -> None:
    custom = ev.CustomEvent(
        run_id="r", step=1, call_id="c1", tool="fetch", attempt=2, name="progress", data={"done": "a\nb"}
    )
    dropped = ev.CustomEventsDropped(run_id="r", step=1, call_id="c1", tool="fetch", attempt=2, dropped=7)
    voided = ev.CustomEventsVoided(
        run_id="r", step=1, call_id="c1", tool="fetch", attempt=1, reason="taken_over"
    )
    lines = [render_event(e) for e in (custom, dropped, voided)]
    assert 'fetch progress {"done": "a\\nb"} id=c1 attempt=2' in lines[0]
    assert "fetch id=c1 attempt=2: 7 dropped" in lines[1]
    assert "custom events of attempt 1 and earlier are void (taken over)" in lines[2]
    assert all("\n" not in line for line in lines)
