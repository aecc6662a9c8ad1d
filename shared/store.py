"""The run store: Redis keys and the atomic scripts over them.

Every write that matters is one Lua script, so Redis sees it whole or not at all:

* :meth:`RunStore.begin` — read the head, claim the phase (outbox sent, attempt counted, lease set);
* :meth:`RunStore.commit` — compare-and-set the version, append messages, emit events, record the
  checkpoint and the outbox of tasks to publish next;
* :meth:`RunStore.record_result` — one tool result once per ``(run, step, call_id)``, and the fan-in:
  the last result moves the run to OBSERVING and puts observe in the outbox.

A commit costs the same at step 50 as at step 1: messages are appended, never rewritten.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

import redis

from shared.errors import InternalInvariant
from shared.events import Event, dump_event, load_event
from shared.keys import Keys
from shared.messages import MESSAGE_ADAPTER, Message, dump_message
from shared.settings import Settings
from shared.state import Decision, Phase, RunHead, TaskSpec, ToolResult


def _script(name: str) -> str:
    return resources.files("shared").joinpath("lua", f"{name}.lua").read_text()


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Claim:
    """What :meth:`RunStore.begin` returns when the run is where the task expected it."""

    head: RunHead
    attempts: int
    messages: list[Message]
    cancel_requested: bool
    #: The claim this delivery holds (renewed by the heartbeat, ended by the commit or result).
    claim_field: str
    token: str
    #: "none", or "expired"/"takeover" when an earlier attempt claimed this work and never finished.
    prior: str
    #: The step's tool results, when asked for.
    results: list[ToolResult]


@dataclass(frozen=True)
class Busy:
    """Another delivery holds a live claim on this phase; this one must do nothing."""


@dataclass(frozen=True)
class Done:
    """The tool call this delivery names already has its result: a duplicate."""


@dataclass(frozen=True)
class Recovery:
    """The sweeper took a run over: re-publish ``outbox`` under the new ``epoch``."""

    run_id: str
    phase: Phase
    version: int
    epoch: int
    step: int
    outbox: list[TaskSpec]
    #: How many times the sweeper has taken this version over.
    takeovers: int


@dataclass(frozen=True)
class Stale:
    """The run is not where the task expected: a duplicate or late delivery."""

    head: RunHead | None
    outbox: list[TaskSpec]
    outbox_sent: bool
    #: The broker redelivered this task because its worker died.
    takeover: bool = False


CommitStatus = Literal["committed", "fenced", "cancel_pending"]
RecordStatus = Literal["stale", "duplicate", "recorded", "complete"]


class RunStore:
    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.redis = client
        self.settings = settings
        self.keys = Keys(settings.prefix)
        self._begin = client.register_script(_script("begin"))
        self._commit = client.register_script(_script("commit"))
        self._record = client.register_script(_script("record_result"))
        self._cancel = client.register_script(_script("cancel"))
        self._renew = client.register_script(_script("renew"))
        self._recover = client.register_script(_script("recover"))
        self._decide = client.register_script(_script("decide"))
        self._messages = MessageCache()

    # -- reading ---------------------------------------------------------------------------

    @staticmethod
    def _head_from_fields(fields: dict[str, str]) -> RunHead:
        head = RunHead.model_validate_json(fields["body"])
        # The fan-in script moves phase/version without rewriting the body; the fields win.
        return head.model_copy(
            update={
                "phase": Phase(fields["phase"]),
                "version": int(fields["version"]),
                "step": int(fields["step"]),
                "epoch": int(fields["epoch"]),
            }
        )

    @staticmethod
    def _pairs(flat: Sequence[Any]) -> dict[str, str]:
        it = iter(flat)
        return {_s(k): _s(v) for k, v in zip(it, it, strict=True)}

    def load(self, run_id: str) -> RunHead | None:
        fields = self.load_raw(run_id)
        return self._head_from_fields(fields) if fields else None

    def load_raw(self, run_id: str) -> dict[str, str]:
        raw = self.redis.hgetall(self.keys.run(run_id))
        return {_s(k): _s(v) for k, v in raw.items()}

    def load_messages(self, run_id: str, start: int = 0, end: int = -1) -> list[Message]:
        raw = self.redis.lrange(self.keys.messages(run_id), start, end)
        return [MESSAGE_ADAPTER.validate_json(m) for m in raw]

    def load_results(self, run_id: str, step: int) -> list[ToolResult]:
        raw = self.redis.hvals(self.keys.results(run_id, step))
        return [ToolResult.model_validate_json(r) for r in raw]

    def has_result(self, run_id: str, step: int, call_id: str) -> bool:
        return bool(self.redis.hexists(self.keys.results(run_id, step), call_id))

    def checkpoints(self, run_id: str) -> list[RunHead]:
        return [
            RunHead.model_validate_json(r) for r in self.redis.lrange(self.keys.checkpoints(run_id), 0, -1)
        ]

    def cancel_requested(self, run_id: str) -> bool:
        return _s(self.redis.hget(self.keys.run(run_id), "cancel") or b"") == "1"

    # -- claiming ----------------------------------------------------------------------------

    def begin(
        self,
        run_id: str,
        version: int,
        phase: Phase,
        epoch: int,
        step: int,
        attempt_field: str,
        *,
        call_id: str | None = None,
        with_messages: bool = False,
        with_results: bool = False,
        takeover: bool = False,
    ) -> Claim | Busy | Done | Stale | None:
        """Claim a phase (or one tool call of it) for this delivery, in one round trip.

        ``with_messages`` reads the conversation (only the part this process has not cached),
        ``with_results`` the step's tool results. ``takeover`` says the broker redelivered this
        task because its worker was lost, so a claim that has not expired yet belongs to a dead
        process and may be taken over.
        """
        now = time.time()
        deadline = now + self.settings.lease_s
        claim_field = f"claim:{call_id}" if call_id is not None else "running"
        token = uuid.uuid4().hex[:16]
        cached = self._messages.get(run_id) if with_messages else None
        k = self.keys
        reply = self._begin(
            keys=[k.run(run_id), k.attempts(run_id), k.leases(), k.messages(run_id), k.results(run_id, step)],
            args=[
                str(version),
                phase.value,
                attempt_field,
                f"{deadline:.3f}",
                run_id,
                (str(len(cached)) if cached is not None else "0") if with_messages else "",
                str(epoch),
                claim_field,
                token,
                f"{now:.3f}",
                "1" if takeover else "0",
                "all" if with_results else (call_id or ""),
            ],
        )
        status = _s(reply[0])
        if status == "missing":
            return None
        if status == "busy":
            return Busy()
        if status == "done":
            return Done()
        fields = self._pairs(reply[1])
        head = self._head_from_fields(fields)
        if status == "stale":
            outbox = [TaskSpec.model_validate(t) for t in _json_list(fields.get("outbox", "[]"))]
            return Stale(
                head=head, outbox=outbox, outbox_sent=fields.get("outbox_sent") == "1", takeover=takeover
            )
        messages: list[Message] = []
        if with_messages:
            messages = [*(cached or []), *(MESSAGE_ADAPTER.validate_json(m) for m in reply[3])]
            if len(messages) != head.message_count:
                # Only appends ever happen, so this means the cache is not this run's prefix.
                messages = self.load_messages(run_id)
            self._messages.put(run_id, messages)
        return Claim(
            head=head,
            attempts=int(reply[2]),
            messages=messages,
            cancel_requested=fields.get("cancel") == "1",
            claim_field=claim_field,
            token=token,
            prior=_s(reply[4]),
            results=[ToolResult.model_validate_json(r) for r in reply[5]],
        )

    def renew(self, run_id: str, claim_field: str, token: str) -> tuple[bool, bool]:
        """Extend a claim and the run's lease; returns (still held, cancel requested)."""
        deadline = time.time() + self.settings.lease_s
        reply = self._renew(
            keys=[self.keys.run(run_id), self.keys.leases()],
            args=[claim_field, token, f"{deadline:.3f}", run_id],
        )
        return int(reply[0]) == 1, int(reply[1]) == 1

    def submit_decision(self, run_id: str, version: int, decision: Decision) -> bool:
        """Store a human's decision on a run parked at ``version``; False if it is not parked there."""
        reply = self._decide(keys=[self.keys.run(run_id)], args=[str(version), decision.model_dump_json()])
        return int(reply) == 1

    def load_decision(self, run_id: str) -> Decision | None:
        raw = self.redis.hget(self.keys.run(run_id), "decision")
        return Decision.model_validate_json(raw) if raw else None

    def park(self, run_id: str, claim_field: str, token: str) -> None:
        """Give a claim on a parked run back and take it off the sweeper's watch list."""
        self.release_claim(run_id, claim_field, token)
        self.redis.zrem(self.keys.leases(), run_id)

    def release_claim(self, run_id: str, claim_field: str, token: str) -> None:
        key = self.keys.run(run_id)
        value = self.redis.hget(key, claim_field)
        if value is not None and _s(value).startswith(token + "|"):
            self.redis.hdel(key, claim_field)

    def expired_leases(self, limit: int = 100) -> list[str]:
        return [
            str(r)
            for r in self.redis.zrangebyscore(self.keys.leases(), "-inf", time.time(), start=0, num=limit)
        ]

    def recover(self, run_id: str) -> Recovery | None:
        """Take over a run whose lease expired (see ``recover.lua``); None if there is nothing to do."""
        now = time.time()
        reply = self._recover(
            keys=[self.keys.run(run_id), self.keys.leases(), self.keys.attempts(run_id)],
            args=[run_id, f"{now:.3f}", f"{now + self.settings.queued_lease_s:.3f}"],
        )
        if _s(reply[0]) != "recover":
            return None
        outbox = [TaskSpec.model_validate(t) for t in _json_list(_s(reply[5]))]
        return Recovery(
            run_id=run_id,
            phase=Phase(_s(reply[1])),
            version=int(reply[2]),
            epoch=int(reply[3]),
            step=int(reply[4]),
            outbox=outbox,
            takeovers=int(reply[6]),
        )

    # -- writing -----------------------------------------------------------------------------

    def commit(
        self,
        expected_version: int | None,
        head: RunHead,
        messages: Sequence[Message] = (),
        events: Sequence[Event] = (),
        outbox: Sequence[TaskSpec] = (),
    ) -> CommitStatus:
        """Compare-and-set ``head`` over ``expected_version`` (``None`` creates the run)."""
        if expected_version is not None and head.version != expected_version + 1:
            raise InternalInvariant(f"commit of version {head.version} over {expected_version}")
        limits = self.settings.limits
        k = self.keys
        terminal = head.phase.terminal
        leased = not terminal and head.phase is not Phase.AWAITING_APPROVAL
        # Until the next phase is claimed, the run is only queued: a longer lease, so a backlog
        # does not look like a crash (a claimed phase gets the short lease in begin()).
        lease = f"{time.time() + self.settings.queued_lease_s:.3f}" if leased else ""
        args: list[str] = [
            "" if expected_version is None else str(expected_version),
            str(head.version),
            head.phase.value,
            str(head.step),
            str(head.epoch),
            head.model_dump_json(),
            _dump_outbox(outbox),
            "1" if terminal else "0",
            str(limits.events_maxlen),
            str(self.settings.retention_s),
            lease,
            head.run_id,
            f"{time.time():.3f}",
            str(len(messages)),
            str(len(events)),
            *(dump_message(m) for m in messages),
            *(dump_event(e) for e in events),
        ]
        # A finished run's per-step keys expire with it (bounded: steps <= max_steps).
        extra = (
            [k.attempts(head.run_id)] + [k.results(head.run_id, step) for step in range(1, head.step + 1)]
            if terminal
            else []
        )
        reply = self._commit(
            keys=[
                k.run(head.run_id),
                k.messages(head.run_id),
                k.checkpoints(head.run_id),
                k.events(head.run_id),
                k.leases(),
                k.runs_index(),
                *extra,
            ],
            args=args,
        )
        return {1: "committed", 0: "fenced", -1: "cancel_pending"}[int(reply[0])]  # type: ignore[return-value]

    def record_result(
        self, head: RunHead, result: ToolResult, event: Event, observe: TaskSpec
    ) -> tuple[RecordStatus, int]:
        """Record a result once; returns the status and, when complete, the run's current epoch."""
        k = self.keys
        reply = self._record(
            keys=[k.run(head.run_id), k.results(head.run_id, head.step), k.events(head.run_id), k.leases()],
            args=[
                str(head.version),
                result.call_id,
                result.model_dump_json(),
                dump_event(event),
                str(len(head.pending_calls)),
                _dump_outbox([observe]),
                str(self.settings.limits.events_maxlen),
                f"{time.time() + self.settings.queued_lease_s:.3f}",
                head.run_id,
            ],
        )
        status, _, epoch = _s(reply).partition(":")
        return status, int(epoch or head.epoch)  # type: ignore[return-value]

    def emit(self, run_id: str, events: Sequence[Event]) -> None:
        """Append events that are not part of a commit (live token deltas)."""
        if not events:
            return
        key = self.keys.events(run_id)
        with self.redis.pipeline(transaction=False) as pipe:
            for e in events:
                pipe.xadd(
                    key, {"e": dump_event(e)}, maxlen=self.settings.limits.events_maxlen, approximate=True
                )
            pipe.execute()

    def request_cancel(self, run_id: str) -> Phase | None:
        phase = _s(self._cancel(keys=[self.keys.run(run_id)]))
        return Phase(phase) if phase else None

    # -- events ------------------------------------------------------------------------------

    def read_events(self, run_id: str, after: str = "0-0", count: int = 1000) -> list[tuple[str, Event]]:
        raw = self.redis.xrange(
            self.keys.events(run_id), min=f"({after}" if after != "0-0" else "-", count=count
        )
        return _entries(raw)

    def wait_events(self, run_id: str, after: str, timeout_s: float) -> list[tuple[str, Event]]:
        """Block up to ``timeout_s`` for events after ``after`` (XREAD BLOCK; polled when embedded)."""
        key = self.keys.events(run_id)
        if self.settings.embedded:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if batch := self.read_events(run_id, after):
                    return batch
                time.sleep(0.01)
            return []
        reply: Any = self.redis.xread({key: after}, count=500, block=max(1, int(timeout_s * 1000)))
        return _entries(reply[0][1] if reply else [])


class MessageCache:
    """Validated conversations of recently seen runs, per process.

    A run's message list is append-only, so a think only needs the messages added since this
    process last saw the run: the Redis read and the validation then stay flat in the run's length.
    """

    def __init__(self, max_runs: int = 128) -> None:
        self.max_runs = max_runs
        self._runs: OrderedDict[str, list[Message]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, run_id: str) -> list[Message] | None:
        with self._lock:
            messages = self._runs.get(run_id)
            if messages is not None:
                self._runs.move_to_end(run_id)
            return messages

    def put(self, run_id: str, messages: list[Message]) -> None:
        with self._lock:
            self._runs[run_id] = messages
            self._runs.move_to_end(run_id)
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)


def _entries(raw: Any) -> list[tuple[str, Event]]:
    return [(_s(eid), load_event(fields["e"])) for eid, fields in raw]


def _dump_outbox(outbox: Sequence[TaskSpec]) -> str:
    return "[" + ",".join(t.model_dump_json() for t in outbox) + "]"


def _json_list(raw: str) -> list[Any]:
    value = json.loads(raw)
    return value if isinstance(value, list) else []
