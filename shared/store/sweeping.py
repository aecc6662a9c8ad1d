"""The sweeper's side: runs whose lease time came, a look at each, and the hand-on of their work.

* :meth:`SweepingMixin.inspect` / :meth:`SweepingMixin.hand_on` — the sweeper's look at a run whose
  lease time came, and its hand-on under a new epoch (``recover.lua``);
* :meth:`SweepingMixin.wait_in_queue` — the run's unclaimed tasks are still in the broker: wait;
* :meth:`SweepingMixin.mark_unsent` — a publish failed: publish again later, not counted lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from shared import protocol
from shared.scripts import run_many
from shared.state import Phase, TaskSpec
from shared.store.base import _load_outbox, _s, new_op
from shared.store.runs import RunsMixin
from shared.tasks import decide_task

__all__ = [
    "Due",
    "HandedOn",
    "SweepingMixin",
    "TaskState",
]


# -- what the sweeper sees -------------------------------------------------------------------------

TaskState = Literal["done", "live", "expired", "unclaimed"]


@dataclass(frozen=True)
class Due:
    """A run whose current phase needs a decision: a claim expired, or tasks waited past their time."""

    run_id: str
    version: int
    epoch: int
    phase: Phase
    step: int
    outbox: list[TaskSpec]
    #: Per task ("" for the phase, else the call id): done, live, expired or unclaimed.
    states: dict[str, TaskState]
    #: How many times the broker was already checked for this version's unclaimed tasks.
    queued_checks: int

    @property
    def expired(self) -> list[str]:
        return [k for k, s in self.states.items() if s == "expired"]

    @property
    def unclaimed(self) -> list[str]:
        return [k for k, s in self.states.items() if s == "unclaimed"]

    def task_of(self, key: str) -> TaskSpec | None:
        """The outbox task of one state key (the phase's task, or one call's)."""
        for spec in self.outbox:
            if key == "" or spec.arguments.get("call_id") == key:
                return spec
        return None


@dataclass(frozen=True)
class HandedOn:
    """A phase the sweeper handed on under a new epoch."""

    epoch: int
    #: Hand-ons of this version's tasks because their messages had vanished from the broker.
    lost: int
    #: The state keys whose tasks are to be published again under ``epoch``.
    tasks: list[str]


class SweepingMixin(RunsMixin):
    """Due runs, their inspection and their hand-on."""

    # -- the sweeper's side ----------------------------------------------------------------

    def due(self, shard: int, limit: int = 100) -> list[str]:
        """Run ids of ``shard`` whose lease time has come (by Redis's clock)."""
        return [_s(r) for r in self._run("due", [self.keys.leases(shard)], [limit])]

    def due_everywhere(self, limit: int = 100) -> list[list[str]]:
        """:meth:`due` of every shard, in one pipelined round trip (a list per shard; one call per
        shard on a cluster, whose shards lie on several primaries)."""
        calls = [([self.keys.leases(shard)], [str(limit)]) for shard in range(self.keys.shards)]
        return [[_s(r) for r in due] for due in run_many(self.redis, self._scripts["due"], calls)]

    def inspect(self, run_id: str) -> Due | Literal["alive", "settled"]:
        """Look at a run whose lease time came (see ``inspect.lua``)."""
        k = self.keys
        step = int(self.redis.hget(k.run(run_id), protocol.STEP) or 0)
        for _ in range(3):
            reply = self._run(
                "inspect", [k.run(run_id), k.leases_of(run_id), k.results(run_id, step)], [run_id, step]
            )
            status = _s(reply[0])
            if status != "moved":
                break
            step = int(reply[1])
        if status in ("gone", "settled", "moved"):
            return "settled"
        if status == "alive":
            return "alive"
        flat = [_s(x) for x in reply[6]]
        states: dict[str, TaskState] = dict(zip(flat[0::2], flat[1::2], strict=True))  # type: ignore[arg-type]
        phase = Phase(_s(reply[3]))
        outbox = _load_outbox(_s(reply[5]))
        if phase is Phase.AWAITING_APPROVAL:
            # A parked run being resumed: its one task is the decide (its stored outbox holds what
            # parking it sent, such as its subagents' spawns), on the queue the run's head names.
            head = self.load(run_id)
            if head is None or head.phase is not Phase.AWAITING_APPROVAL or head.version != int(reply[1]):
                return "settled"  # moved on since: the next look finds it where it is
            outbox = [decide_task(head)]
        return Due(
            run_id=run_id,
            version=int(reply[1]),
            epoch=int(reply[2]),
            phase=phase,
            step=int(reply[4]),
            outbox=outbox,
            states=states,
            queued_checks=int(reply[7]),
        )

    def wait_in_queue(self, due: Due, wait_s: float) -> bool:
        """Every unclaimed task of ``due`` is still in the broker: look again after ``wait_s``."""
        reply = self._recover(due, "wait", [], wait_s, "")
        return _s(reply[0]) == "waiting"

    def hand_on(self, due: Due, missing: Sequence[str], reason: str) -> HandedOn | None:
        """Hand the phase on under a new epoch; None if the run changed since it was inspected."""
        reply = self._recover(due, "hand_on", missing, 0, reason)
        if _s(reply[0]) != "handed_on":
            return None
        return HandedOn(epoch=int(reply[1]), lost=int(reply[2]), tasks=[_s(t) for t in reply[3]])

    def mark_unsent(self, run_id: str, version: int, epoch: int, delay_s: float) -> bool:
        """A publish of the run's outbox at ``version`` and ``epoch`` failed: the sweeper publishes
        its unclaimed tasks again after ``delay_s``, without asking the broker for them and
        without counting them lost (``unsent.lua``). False if the run moved on or is gone."""
        reply = self._run(
            "unsent",
            [self.keys.run(run_id), self.keys.leases_of(run_id)],
            [run_id, version, epoch, int(delay_s * 1000)],
        )
        return _s(reply) == "1"

    def _recover(self, due: Due, action: str, missing: Sequence[str], wait_s: float, reason: str) -> Any:
        k, run_id = self.keys, due.run_id
        return self._run(
            "recover",
            [k.run(run_id), k.leases_of(run_id), k.attempts(run_id), k.results(run_id, due.step)],
            [
                run_id,
                new_op(),
                action,
                due.version,
                due.epoch,
                due.step,
                ",".join(m or "-" for m in missing),
                int(wait_s * 1000),
                self._queued_ms,
                reason,
            ],
        )
