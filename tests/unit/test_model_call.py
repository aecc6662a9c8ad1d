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
from worker.model_call import ClaimLost, ModelCall
from worker.runtime import Cancelled


class Recorder:
    """Stands in for the store: records what is emitted, and when."""

    def __init__(self) -> None:
        self.emitted: list[tuple[float, str]] = []

    def emit(self, run_id: str, events: list[Event]) -> None:
        for e in events:
            self.emitted.append((time.monotonic(), getattr(e, "text", "")))


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
