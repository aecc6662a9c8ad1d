"""The fenced write path: claiming work, holding the claim, and committing as its holder.

* :meth:`ClaimsMixin.claim_phase` / :meth:`ClaimsMixin.claim_call` — check a delivery against the
  run and claim its work (attempt counted, lease set) in one round trip, reading what the work needs;
* :meth:`ClaimsMixin.commit` — compare-and-set the version as the claim's holder, append messages,
  emit events, record the checkpoint and the outbox of tasks to publish next;
* :meth:`ClaimsMixin.record_result` — one tool result once per ``(run, step, call)``, and the
  fan-in: the last result commits the OBSERVING head.

Each write carries an op id its script recognises, so a replay after a lost reply is harmless.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from shared import protocol
from shared.errors import InternalInvariant
from shared.events import Event, dump_event
from shared.liveness import HeldClaim
from shared.messages import MESSAGE_ADAPTER, Message, dump_message
from shared.scripts import is_cluster, run_many
from shared.state import Phase, RunHead, TaskSpec, ToolResult
from shared.store.base import (
    BrokerCommand,
    _dump_outbox,
    _load_outbox,
    _push_args,
    _s,
    new_op,
    new_token,
)
from shared.store.runs import RunsMixin

__all__ = [
    "Busy",
    "CallClaim",
    "Claim",
    "ClaimOutcome",
    "ClaimRef",
    "ClaimsMixin",
    "CommitStatus",
    "Committed",
    "Done",
    "PhaseClaim",
    "RecordStatus",
    "Recorded",
    "Stale",
]


# -- what claiming answers -----------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseClaim:
    """What a phase task asks to claim: the run at this version, phase, epoch and step."""

    run_id: str
    version: int
    phase: Phase
    epoch: int
    step: int
    #: Read the conversation (only the part this process has not cached).
    read_messages: bool = False
    #: Read the step's tool results.
    read_results: bool = False
    #: Read how many signals were sent into the run (``Claim.signals_sent``).
    read_inbox: bool = False
    #: Read where the run's callback stands and its attempts (``Claim.callback``).
    read_callback: bool = False


@dataclass(frozen=True)
class CallClaim:
    """What a tool task asks to claim: one call of the run's current step."""

    run_id: str
    version: int
    epoch: int
    step: int
    call_id: str


@dataclass(frozen=True)
class Claim:
    """This delivery holds the work: do it, then commit as the claim's holder."""

    head: RunHead
    #: Claims of this work at this version, this one included (poison detection).
    attempts: int
    messages: list[Message]
    cancel_requested: bool
    #: The claim field this delivery holds (renewed by the heartbeat, ended by the commit or result).
    field: str
    token: str
    #: "none", or "expired" when an earlier delivery claimed this work and never finished it.
    prior: str
    #: The step's tool results, when asked for.
    results: list[ToolResult]
    #: The last thing known to have gone wrong with this work ("" if nothing).
    last_error: str
    #: When this delivery got the claim (this worker's clock): the start of its timeline bar.
    claimed_at: float = 0.0
    #: The sequence number of the last signal sent into the run, read with the claim when asked
    #: for (``PhaseClaim.read_inbox``; None otherwise): a cursor at it means nothing is pending.
    signals_sent: int | None = None
    #: The run's callback status and state (JSON) as stored, read with the claim when asked for
    #: (``PhaseClaim.read_callback``; None otherwise, and either may be None when unset).
    callback: tuple[str | None, str | None] | None = None

    @property
    def ref(self) -> ClaimRef:
        return ClaimRef(self.field, self.token, self.claimed_at, self.attempts)


@dataclass(frozen=True)
class Busy:
    """Another delivery holds a live claim on this work; this one must do nothing."""


@dataclass(frozen=True)
class Done:
    """The tool call this delivery names already has its result: a duplicate."""


@dataclass(frozen=True)
class Stale:
    """The run is not where the delivery expected: a duplicate, a late or a forged message."""

    version: int
    phase: Phase
    epoch: int
    outbox: list[TaskSpec]
    #: Some delivery of the current outbox already claimed work.
    outbox_claimed: bool

    @property
    def terminal(self) -> bool:
        return self.phase.terminal


ClaimOutcome = Claim | Busy | Done | Stale | None


# -- what writing answers --------------------------------------------------------------------------

CommitStatus = Literal["committed", "fenced", "cancel_pending", "signals_pending"]
RecordStatus = Literal["stale", "duplicate", "recorded", "complete"]


@dataclass(frozen=True)
class Committed:
    """What a commit did."""

    status: CommitStatus
    #: The run's epoch after a successful commit (tasks are published under it).
    epoch: int = 0
    #: The script pushed the commit's broker commands itself: nothing is left to publish.
    pushed: bool = False


@dataclass(frozen=True)
class Recorded:
    """What recording a tool result did."""

    status: RecordStatus
    #: The run's epoch when the fan-in completed (observe is published under it).
    epoch: int = 0
    #: The script pushed observe's broker commands itself: nothing is left to publish.
    pushed: bool = False


@dataclass(frozen=True)
class ClaimRef:
    """The claim a commit is made under."""

    field: str
    token: str
    #: When the claim was taken and how many claims of the work it is (0: not known).
    claimed_at: float = 0.0
    attempt: int = 0


class ClaimsMixin(RunsMixin):
    """Claims (taken, renewed, released) and the writes made under them."""

    # -- claiming --------------------------------------------------------------------------

    def claim_phase(self, want: PhaseClaim, holder: str) -> ClaimOutcome:
        """Claim a phase for this delivery, in one round trip (see ``claim_phase.lua``)."""
        run_id = want.run_id
        k = self.keys.of(run_id)
        token = new_token()
        cached = self._messages.get(run_id) if want.read_messages else None
        reply = self._run(
            "claim_phase",
            [
                k.run,
                k.attempts,
                k.leases,
                k.messages,
                k.results(want.step),
                k.inbox,
                k.last_claim(holder),
            ],
            [
                run_id,
                want.version,
                want.phase.value,
                want.epoch,
                want.step,
                token,
                holder,
                self._lease_ms,
                (len(cached) if cached is not None else 0) if want.read_messages else "",
                "1" if want.read_results else "0",
                "1" if want.read_inbox else "0",
                HeldClaim(run_id, protocol.RUNNING, holder, want.version).dump(),
                "1" if want.read_callback else "0",
            ],
        )
        status = _s(reply[0])
        if status != "ok":
            return self._unclaimed(status, reply)
        head = self._head_of(reply[1])
        messages: list[Message] = []
        if want.read_messages:
            messages = [*(cached or []), *(MESSAGE_ADAPTER.validate_json(m) for m in reply[3])]
            if len(messages) != head.message_count:
                # Only appends ever happen, so this means the cache is not this run's prefix.
                messages = self.load_messages(run_id)
            self._messages.put(run_id, messages)
        return Claim(
            head=head,
            attempts=int(reply[2]),
            messages=messages,
            cancel_requested=_s(reply[1][3] or "") == "1",
            field=protocol.RUNNING,
            token=token,
            prior=_s(reply[4]),
            results=[ToolResult.model_validate_json(r) for r in reply[5]],
            last_error=_s(reply[6]),
            claimed_at=time.time(),
            signals_sent=int(_s(reply[7])) if want.read_inbox else None,
            callback=_callback_of(reply[8]) if want.read_callback else None,
        )

    def claim_call(self, want: CallClaim, holder: str) -> ClaimOutcome:
        """Claim one tool call for this delivery (see ``claim_call.lua``)."""
        run_id = want.run_id
        k = self.keys.of(run_id)
        token = new_token()
        reply = self._run(
            "claim_call",
            [k.run, k.attempts, k.leases, k.results(want.step), k.last_claim(holder)],
            [
                run_id,
                want.version,
                want.epoch,
                want.step,
                want.call_id,
                token,
                holder,
                self._lease_ms,
                HeldClaim(run_id, protocol.call_claim(want.step, want.call_id), holder, want.version).dump(),
            ],
        )
        status = _s(reply[0])
        if status != "ok":
            return self._unclaimed(status, reply)
        return Claim(
            head=self._head_of(reply[1]),
            attempts=int(reply[2]),
            messages=[],
            cancel_requested=_s(reply[1][3] or "") == "1",
            field=protocol.call_claim(want.step, want.call_id),
            token=token,
            prior=_s(reply[3]),
            results=[],
            last_error=_s(reply[4]),
            claimed_at=time.time(),
        )

    @staticmethod
    def _head_of(raw: Sequence[Any]) -> RunHead:
        return RunHead.compose(_s(raw[0]), _s(raw[1]), int(raw[2]))

    @staticmethod
    def _unclaimed(status: str, reply: Sequence[Any]) -> ClaimOutcome:
        if status == "missing":
            return None
        if status == "busy":
            return Busy()
        if status == "done":
            return Done()
        if status != "stale":
            raise InternalInvariant(f"unexpected claim status {status!r}")
        version, phase, _, epoch, outbox, claimed = (_s(v) if v is not None else "" for v in reply[1][:6])
        return Stale(
            version=int(version),
            phase=Phase(phase),
            epoch=int(epoch),
            outbox=_load_outbox(outbox or "[]"),
            outbox_claimed=claimed == "1",
        )

    def renew(self, claims: Sequence[tuple[str, str, str, bool]]) -> list[tuple[bool, bool]]:
        """Renew claims ``(run_id, field, token, extend)`` in one round trip.

        Returns (still held, cancel requested) for each. ``extend`` False only checks the claim
        (a tool past its deadline is left to expire and be handed on).
        """
        if not claims:
            return []
        replies = run_many(
            self.redis,
            self._scripts["renew"],
            [
                (
                    [(k := self.keys.of(run_id)).run, k.leases],
                    [run_id, field, token, self._lease_ms, int(extend)],
                )
                for run_id, field, token, extend in claims
            ],
        )
        return [(int(r[0]) == 1, int(r[1]) == 1) for r in replies]

    def replicate(self, run_id: str, timeout_ms: int) -> int:
        """Wait until a replica holds every write made so far to ``run_id``'s slot (``WAIT 1``),
        at most ``timeout_ms``; returns how many replicas acknowledged (0: none in time).

        ``WAIT`` covers the writes of the connection it is sent on, and a connection of the pool may
        not be the one the claim went through; so it follows a write of its own on the same
        connection, to the shard's ``sync`` key, which the replication stream orders after the claim.
        On a cluster the pair goes to the primary of the run's slot; a slot that moved since (a
        failover) raises, and the lease hands the work on.
        """
        key = self.keys.sync_of(run_id)
        if is_cluster(self.redis):
            node = self.redis.get_node_from_key(key)  # type: ignore[attr-defined]
            client: Any = self.redis.get_redis_connection(node)  # type: ignore[attr-defined]
        else:
            client = self.redis
        with client.pipeline(transaction=False) as pipe:
            pipe.set(key, run_id, px=60_000)
            pipe.execute_command("WAIT", 1, timeout_ms)
            replies = pipe.execute()
        return int(replies[1])

    def release(self, run_id: str, field: str, token: str, version: int) -> bool:
        """Give up a claim this token holds, at the run's ``version``, without having done its work
        (atomically: only if it still holds it); the claim is no longer counted in the attempts."""
        k = self.keys
        reply = self._run(
            "release", [k.run(run_id), k.attempts(run_id)], [field, "token", token, str(version), ""]
        )
        return int(reply) == 1

    def expire_dead_holder(self, run_id: str, version: int, field: str, holder: str, reason: str) -> bool:
        """The process ``holder`` died (its worker saw it): expire its claim now, noting why."""
        k = self.keys
        reply = self._run(
            "release", [k.run(run_id), k.attempts(run_id)], [field, "holder", holder, version, reason[:500]]
        )
        return int(reply) == 1

    # -- committing ------------------------------------------------------------------------

    def commit(
        self,
        current: RunHead,
        head: RunHead,
        claim: ClaimRef | None,
        messages: Sequence[Message] = (),
        events: Sequence[Event] = (),
        outbox: Sequence[TaskSpec] = (),
        push: Sequence[BrokerCommand] = (),
    ) -> Committed:
        """Compare-and-set ``head`` over ``current`` (its version) as the holder of ``claim``.

        ``claim`` None commits without a claim (the sweeper failing a poisoned run): allowed only
        while no delivery holds a live claim on the phase. The run's status index follows it from
        ``current``'s status to ``head``'s.

        ``push``: the broker commands that publish ``outbox`` under ``current``'s epoch (Redis
        broker on this server only). The script runs them with the commit when the run is still at
        that epoch, and says so (``Committed.pushed``); otherwise the caller publishes.
        """
        expected_version = current.version
        if head.version != expected_version + 1:
            raise InternalInvariant(f"commit of version {head.version} over {expected_version}")
        limits = self.settings.limits
        run_id, tenant = head.run_id, head.tenant
        k = self.keys.of(run_id)
        kind = (
            "terminal" if head.terminal else ("parked" if head.phase is Phase.AWAITING_APPROVAL else "live")
        )
        body = head.dump_body()
        args: list[Any] = [
            run_id,
            new_op(),
            expected_version,
            claim.field if claim else "",
            claim.token if claim else "",
            head.version,
            head.phase.value,
            head.step,
            body,
            _dump_outbox(outbox),
            ",".join(c.id for c in head.pending_calls) if head.phase is Phase.ACTING else "",
            kind,
            self._queued_ms,
            self.settings.retention_s,
            limits.events_maxlen,
            len(messages),
            len(events),
            tenant or "-",
            "1" if kind == "terminal" and head.callback is not None else "0",
            # An answer is refused while signals past its think's cursor wait (``commit.lua``).
            str(current.signals_applied)
            if current.phase is Phase.THINKING and head.phase is Phase.COMPLETED
            else "",
            *(dump_message(m) for m in messages),
            *(dump_event(e) for e in events),
            *_push_args(current.epoch, push),
        ]
        # A finished run's per-step keys expire with it (bounded: steps <= max_steps).
        extra = (
            [k.attempts, k.inbox] + [k.results(step) for step in range(1, head.step + 1)]
            if kind == "terminal"
            else []
        )
        reply = self._run(
            "commit",
            [
                k.run,
                k.messages,
                k.checkpoints,
                k.events,
                k.leases,
                k.indexes,
                k.inflight,
                k.index(tenant, "status", current.status),
                k.index(tenant, "status", head.status),
                k.ended,
                *extra,
            ],
            args,
        )
        status = _s(reply[0])
        if status != "committed":
            return Committed(status)  # type: ignore[arg-type]
        return Committed("committed", int(reply[1]), len(reply) > 2 and _s(reply[2]) == "1")

    def record_result(
        self,
        head: RunHead,
        claim: ClaimRef,
        result: ToolResult,
        event: Event,
        observing: RunHead,
        observe: TaskSpec,
        push: Sequence[BrokerCommand] = (),
    ) -> Recorded:
        """Record a call's result once; the last result of the step commits ``observing``.

        ``push``: the broker commands that publish ``observe`` under ``head``'s epoch, run by the
        script with the fan-in as :meth:`commit` runs its own.
        """
        run_id = head.run_id
        k = self.keys.of(run_id)
        reply = self._run(
            "record_result",
            [k.run, k.results(head.step), k.events, k.leases, k.checkpoints],
            [
                run_id,
                new_op(),
                head.version,
                head.step,
                result.call_id,
                claim.token,
                result.model_dump_json(),
                dump_event(event),
                len(head.done_calls) + len(head.pending_calls),  # every wave's results count
                observing.version,
                observing.dump_body(),
                _dump_outbox([observe]),
                self._queued_ms,
                self.settings.limits.events_maxlen,
                *_push_args(head.epoch, push),
            ],
        )
        status = _s(reply[0])
        if status != "complete":
            return Recorded(status)  # type: ignore[arg-type]
        return Recorded("complete", int(reply[1]), len(reply) > 2 and _s(reply[2]) == "1")

    def record_child(self, parent: RunHead, result: ToolResult, event: Event) -> int | None:
        """Record a child run's outcome as ``parent``'s result for its call, once (its event with it).

        Returns how many results the parent's step has now, or None if the parent no longer waits
        for its children at that step. Once every child of the step has ended, the parent is owed
        its resume: the sweeper sends its decide task if that message goes missing.
        """
        k, run_id = self.keys, parent.run_id
        expected = len(parent.approval.call_ids) if parent.approval is not None else 0
        reply = self._run(
            "record_child",
            [k.run(run_id), k.results(run_id, parent.step), k.events(run_id), k.leases_of(run_id)],
            [
                parent.step,
                result.call_id,
                result.model_dump_json(),
                dump_event(event),
                self.settings.limits.events_maxlen,
                expected,
                self._queued_ms,
                run_id,
            ],
        )
        return None if _s(reply[0]) == "stale" else int(reply[1])


def _callback_of(reply: Any) -> tuple[str | None, str | None]:
    """A run's (callback, callback_state) fields from the claim's reply (Lua's false: unset)."""
    status, state = reply
    return (_s(status) if status else None, _s(state) if state else None)
