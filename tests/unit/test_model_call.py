"""A think's model call on its helper thread: text reaches the event stream on a timer, a cancel
gives the call up at once, a lost claim too."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shared.events import Event
from shared.llm.base import ModelRequest, ModelResponse, StreamPart, TextDelta
from worker.heartbeat import Held
from worker.model_call import ClaimLost, Helpers, ModelCall
from worker.runtime import Cancelled


class Recorder:
    """Stands in for the store: records what is emitted, and when."""

    def __init__(self) -> None:
        self.emitted: list[tuple[float, str]] = []

    def emit(
        self, run_id: str, events: list[Event], step: int | None = None, claim_token: str | None = None
    ) -> int:
        for e in events:
            self.emitted.append((time.monotonic(), getattr(e, "text", "")))
        return len(events)


class Stalling:
    """Streams a first piece, then stalls until released, then ends."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def stream(self, request: ModelRequest) -> Iterator[StreamPart]:
        yield TextDelta(text="before the stall")
        self.release.wait(30)
        yield TextDelta(text=" and after")
        yield ModelResponse(text="before the stall and after")

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.release.wait(30)
        return ModelResponse(text="late")


def call(store: Recorder, held: Held, stream: bool = True) -> ModelCall:
    return ModelCall(store, run_id="r", step=1, held=held, stream=stream, max_delta_chars=1000)  # type: ignore[arg-type]


def test_text_before_a_stall_reaches_the_events_during_the_stall() -> None:
    store, model, held = Recorder(), Stalling(), Held("r", "running", "t")
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(r=call(store, held).run(model, REQUEST)))
    thread.start()
    deadline = time.monotonic() + 10
    while not store.emitted and time.monotonic() < deadline:
        time.sleep(0.01)
    # Flushed while the provider still stalls: the stream has not ended.
    assert [text for _, text in store.emitted] == ["before the stall"]
    assert thread.is_alive()
    model.release.set()
    thread.join(10)
    assert result["r"].text == "before the stall and after"
    assert [text for _, text in store.emitted] == ["before the stall", " and after"]


@pytest.mark.parametrize("stream", [True, False])
def test_a_cancel_gives_the_call_up(stream: bool) -> None:
    store, model, held = Recorder(), Stalling(), Held("r", "running", "t")
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            call(store, held, stream).run(model, REQUEST)
        except BaseException as exc:
            outcome["exc"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    held.cancelled.set()
    thread.join(10)
    assert not thread.is_alive(), "the call was not given up"
    assert isinstance(outcome.get("exc"), Cancelled)
    model.release.set()


def test_a_lost_claim_gives_the_call_up() -> None:
    store, model, held = Recorder(), Stalling(), Held("r", "running", "t")
    held.lost.set()
    with pytest.raises(ClaimLost):
        call(store, held).run(model, REQUEST)
    model.release.set()


REQUEST = ModelRequest(model="m", messages=[])


class AllAtOnce:
    """Sends its whole answer as one streamed part, as some providers and adapters do."""

    def __init__(self, text: str) -> None:
        self.text = text

    def stream(self, request: ModelRequest) -> Iterator[StreamPart]:
        yield TextDelta(text=self.text)
        yield ModelResponse(text=self.text)

    def complete(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse(text=self.text)


@pytest.mark.parametrize("carried", [False, True], ids=["emitted", "carried by the commit"])
def test_text_past_the_event_bound_is_split_across_deltas_not_cut(carried: bool) -> None:
    """A flush of more text than one event may hold goes out as several deltas, in order: a client
    that puts the deltas together gets the whole text (it once got the first 1,000 characters)."""
    store, held = Recorder(), Held("r", "running", "t")
    text = "".join(f"{i:05d}" for i in range(500))  # 2,500 characters, each place distinct
    kept: list[Event] = []
    model_call = call(store, held)
    if carried:
        model_call.carry = lambda *deltas: kept.extend(deltas)
    assert model_call.run(AllAtOnce(text), REQUEST).text == text
    pieces = [getattr(e, "text", "") for e in kept] if carried else [t for _, t in store.emitted]
    assert [len(p) for p in pieces] == [1000, 1000, 500]
    assert "".join(pieces) == text


def _ran_on(helpers: Helpers, block: threading.Event | None = None) -> threading.Event:
    """Runs a job on ``helpers``; the event is set once the job ran (after ``block``, if given)."""
    done = threading.Event()

    def job() -> None:
        if block is not None:
            block.wait(30)
        seen.append(threading.get_ident())
        done.set()

    helpers.run(job)
    return done


seen: list[int] = []


def _wait_idle(helpers: Helpers, n: int) -> None:
    deadline = time.monotonic() + 10
    while helpers.idle() != n and time.monotonic() < deadline:
        time.sleep(0.005)
    assert helpers.idle() == n


def test_helpers_are_reused_one_call_after_another() -> None:
    helpers = Helpers(keep=2)
    seen.clear()
    for _ in range(5):
        assert _ran_on(helpers).wait(10)
        _wait_idle(helpers, 1)
    assert len(set(seen)) == 1


def test_a_helper_busy_with_an_abandoned_call_is_not_given_the_next() -> None:
    helpers = Helpers(keep=2)
    seen.clear()
    stuck = threading.Event()
    first = _ran_on(helpers, block=stuck)  # a call nobody waits for any more, still running
    assert _ran_on(helpers).wait(10)  # runs at once, on another thread
    stuck.set()
    assert first.wait(10)
    assert len(set(seen)) == 2
    _wait_idle(helpers, 2)


def test_at_most_keep_helpers_stay_idle() -> None:
    helpers = Helpers(keep=1)
    release = threading.Event()
    done = [_ran_on(helpers, block=release) for _ in range(3)]
    release.set()
    assert all(d.wait(10) for d in done)
    _wait_idle(helpers, 1)


def test_a_forked_process_does_not_hand_calls_to_its_parents_helpers() -> None:
    helpers = Helpers(keep=2)
    assert _ran_on(helpers).wait(10)
    _wait_idle(helpers, 1)
    helpers._pid = -1  # as a pool child sees the list it inherited: no thread serves it there
    assert helpers.idle() == 0
    assert _ran_on(helpers).wait(10)
