"""One model call of a think phase, run on a helper thread so the phase keeps its hands free.

The think task waits on the call's parts with a short timeout, so it can:

* flush streamed text to the run's events on a timer, not only when the next token arrives (text
  received just before a stall reaches the followers);
* give the call up at once when the heartbeat sees a cancel, streaming or not (an abandoned
  stream is closed at its next part; an abandoned non-streaming call ends with its read timeout
  and its answer is dropped);
* give it up when the claim was lost, since its commit would be fenced off anyway.

The helper threads are kept and reused (:class:`Helpers`): starting a thread for every call cost
more CPU than the rest of a think around a model that answers at once (a scripted one), about
115 against 50 microseconds for a reused one. A helper still busy with an abandoned call is not
reused until that call ends; the next call gets another.
"""

from __future__ import annotations

import contextvars
import os
import queue
import threading
import time
from collections.abc import Callable

from shared import events as ev
from shared.errors import ModelTransport
from shared.llm.base import LlmAdapter, ModelRequest, ModelResponse, StreamPart, TextDelta
from shared.store import RunStore
from worker.heartbeat import Held
from worker.runtime import Cancelled

__all__ = ["ClaimLost", "DELTA_FLUSH_S", "HELPERS", "Helpers", "ModelCall", "Part"]

#: Streamed text is flushed to the event stream at most this often (one round trip per batch),
#: and at least this often while text is waiting.
DELTA_FLUSH_S = 0.05


class Helpers:
    """Threads that run model calls, kept idle between calls (at most ``keep`` of them)."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []
        self._pid = os.getpid()

    def run(self, job: Callable[[], None]) -> None:
        """Run ``job`` on an idle helper, or on a new one when none is idle."""
        with self._lock:
            if self._pid != os.getpid():
                # A forked pool child inherits the list but not the threads behind it.
                self._idle, self._pid = [], os.getpid()
            jobs = self._idle.pop() if self._idle else None
        if jobs is None:
            jobs = queue.SimpleQueue()
            threading.Thread(
                target=self._serve, args=(jobs,), name="wesichain-model-call", daemon=True
            ).start()
        jobs.put(job)

    def _serve(self, jobs: queue.SimpleQueue[Callable[[], None]]) -> None:
        pid = os.getpid()
        while True:
            jobs.get()()
            with self._lock:
                if self._pid != pid or len(self._idle) >= self.keep:
                    return
                self._idle.append(jobs)

    def idle(self) -> int:
        with self._lock:
            return len(self._idle) if self._pid == os.getpid() else 0


#: This process's helpers.
HELPERS = Helpers()


class ClaimLost(Exception):
    """The phase's claim expired and was taken over: its work can no longer be committed."""


class _End:
    """Marks the end of the call's parts."""


Part = StreamPart | BaseException | _End


class ModelCall:
    """One call of ``adapter`` for the think of ``run_id``'s ``step``, under its claim ``held``."""

    def __init__(
        self,
        store: RunStore,
        *,
        run_id: str,
        step: int,
        held: Held,
        stream: bool,
        max_delta_chars: int,
        carry: Callable[..., None] | None = None,
    ) -> None:
        self.store = store
        #: Takes the deltas of the text streamed since the last flush once the stream ended (one, or
        #: several past the event bound), to be appended by the think's commit (which follows at
        #: once) rather than in a round trip of its own.
        self.carry = carry
        self.run_id = run_id
        self.step = step
        self.held = held
        self.stream = stream
        self.max_delta_chars = max_delta_chars
        # A SimpleQueue: its put and get are C, where a Queue's wait builds a Condition's lock each
        # time; only one thread takes the parts.
        self._parts: queue.SimpleQueue[Part] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._pending: list[str] = []
        self._last_flush = time.monotonic()

    def run(self, adapter: LlmAdapter, request: ModelRequest) -> ModelResponse:
        # In a copy of this thread's context: its log lines are about this phase too.
        context = contextvars.copy_context()
        HELPERS.run(lambda: context.run(self._produce, adapter, request))
        final: ModelResponse | None = None
        while not isinstance(item := self._next(), _End):
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, TextDelta):
                self._pending.append(item.text)
            elif isinstance(item, ModelResponse):
                final = item
                break  # the answer is a call's last part (a stream ends with it): only its end follows
            if time.monotonic() - self._last_flush >= DELTA_FLUSH_S:
                self._flush()
        self._flush(last=True)
        if final is None:
            raise ModelTransport(
                "the model stream ended without a final response", retryable=True, step=self.step
            )
        return final

    def _next(self) -> Part | None:
        """The next part, or None after a short wait; raises when the call must be given up."""
        try:
            item: Part | None = self._parts.get(timeout=DELTA_FLUSH_S)
        except queue.Empty:
            item = None
        if self.held.cancelled.is_set():
            self._stop.set()
            raise Cancelled()
        if self.held.lost.is_set():
            self._stop.set()
            raise ClaimLost()
        return item

    def _produce(self, adapter: LlmAdapter, request: ModelRequest) -> None:
        try:
            if not self.stream:
                self._parts.put(adapter.complete(request))
                return
            source = adapter.stream(request)
            try:
                for part in source:
                    self._parts.put(part)
                    if self._stop.is_set():
                        break
            finally:
                close = getattr(source, "close", None)
                if close is not None:
                    close()  # closing the generator closes the HTTP response
        except BaseException as exc:  # handed to the think task
            self._parts.put(exc)
        finally:
            self._parts.put(_End())

    def _flush(self, last: bool = False) -> None:
        if self._pending:
            # The text since the last flush, in deltas of at most the event bound each: a provider
            # that sends much at once (or a whole answer as one part) loses none of it.
            text, size = "".join(self._pending), self.max_delta_chars
            deltas = [
                ev.TokenDelta(run_id=self.run_id, step=self.step, text=text[i : i + size])
                for i in range(0, len(text), size)
            ]
            if last and self.carry is not None:
                self.carry(*deltas)
            else:
                self.store.emit(self.run_id, deltas, step=self.step, claim_token=self.held.token)
            self._pending.clear()
        self._last_flush = time.monotonic()
