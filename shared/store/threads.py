"""Threads and a second message: who holds a conversation thread, who waits for it, and in what order.

A run of a thread is *admitted* to it once (``thread_admit.lua``) under its thread policy
(``reject | enqueue | interrupt | rollback``; see ``docs/agents.md``, "Threads and a second
message"): it holds the thread and starts, or waits behind the runs ahead of it, or (``reject``)
is refused while another run holds the thread. A run that waits is *parked* (``thread_park.lua``):
no worker holds it and no message of it waits in the broker. The run that ends *hands the thread
on* (``thread_release.lua``) and wakes the next (``thread_wake.lua``, then its start is
published); the sweeper's backstop (:meth:`ThreadsMixin.held_threads`) finds a thread whose
hand-on or wake was lost (a kill between a run's terminal commit and its hand-on) and completes it.

A thread's keys share one hash tag (one slot); a run's are on its own shard: admission and the
hand-on are atomic on the thread, parking and waking on the run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, cast

from shared import protocol
from shared.state import THREAD_POLICIES, Phase, ThreadPolicy
from shared.store.base import _s
from shared.store.runs import RunsMixin

__all__ = ["HeldThread", "ThreadTurn", "ThreadsMixin", "Verdict"]

Verdict = Literal["go", "wait", "busy", "ended"]


@dataclass(frozen=True)
class ThreadTurn:
    """Where a run stands in its thread once admitted (``thread_admit.lua``)."""

    #: go: it holds the thread; wait: it waits its turn; busy: refused (``reject``); ended: it had
    #: its turn already.
    verdict: Verdict
    #: The run that held the thread when asked ('' : none).
    holder: str
    #: With ``wait``: the run just before it in the thread, the one it waits for.
    previous: str = ""
    #: With ``interrupt`` or ``rollback``: the runs ahead of it that have not ended, to stop.
    ahead: tuple[str, ...] = ()
    #: A run this admission unparked while handing the thread on from a holder that had ended:
    #: the caller publishes its start ('' : none).
    woken: str = ""


@dataclass(frozen=True)
class HeldThread:
    """A thread some run may hold, as the sweeper's backstop reads it."""

    tenant: str | None
    thread_id: str
    #: The registry's change counter when read (the thread is forgotten only if it is unchanged).
    score: str


class ThreadsMixin(RunsMixin):
    """Admission to threads, parking and waking their runs, and the sweeper's view of them."""

    def _thread_keys(self, tenant: str | None, thread_id: str) -> list[str]:
        k = self.keys
        return [
            k.thread(tenant, thread_id),
            k.thread_state(tenant, thread_id),
            k.thread_waiting(tenant, thread_id),
            k.thread_rolled_back(tenant, thread_id),
        ]

    def admit_to_thread(
        self, tenant: str | None, thread_id: str, run_id: str, policy: ThreadPolicy
    ) -> ThreadTurn:
        """Admit ``run_id`` to its thread under ``policy`` (once; a replay reads its place)."""
        if policy not in THREAD_POLICIES:
            raise ValueError(f"unknown thread policy {policy!r}")
        # Registered first: the sweeper forgets a thread only if nothing touched it since it looked.
        self.redis.zincrby(self.keys.threads_held(), 1, _member(tenant, thread_id))
        turn = self._admit(tenant, thread_id, run_id, policy)
        if turn.verdict != "busy":
            return turn
        # A run's terminal commit is visible before the worker that committed it hands its thread
        # on (the thread's keys are on another slot: a second step). A caller that saw the run end
        # and sends the next message at once must not be refused by a run that holds nothing any
        # more: finish that hand-on here, as the sweeper's backstop would, and ask again.
        ended = self.load(turn.holder)
        if ended is None or not ended.terminal:
            return turn
        woken = self.pass_thread_on(tenant, thread_id, turn.holder) or ""
        again = self._admit(tenant, thread_id, run_id, policy)
        return ThreadTurn(again.verdict, again.holder, again.previous, again.ahead, woken)

    def _admit(self, tenant: str | None, thread_id: str, run_id: str, policy: ThreadPolicy) -> ThreadTurn:
        reply = self._run(
            "thread_admit", self._thread_keys(tenant, thread_id), [run_id, policy, self.settings.retention_s]
        )
        verdict, holder, previous, *ahead = (_s(r) for r in reply)
        return ThreadTurn(cast(Verdict, verdict), holder, previous, tuple(ahead))

    def pass_thread_on(self, tenant: str | None, thread_id: str, run_id: str) -> str | None:
        """``run_id`` ended: hand its thread on and unpark the run that holds it now. Returns that
        run when this call unparked it (its start is the caller's to publish: only one caller
        unparks a run, so its start is published once)."""
        successor = self.hand_thread_on(tenant, thread_id, run_id)
        return successor if successor is not None and self.wake_from_thread(successor) else None

    def hand_thread_on(self, tenant: str | None, thread_id: str, run_id: str) -> str | None:
        """``run_id`` ended: the first run waiting for the thread holds it now (returned, to wake)."""
        k = self.keys
        keys = [k.thread_state(tenant, thread_id), k.thread_waiting(tenant, thread_id)]
        return _s(self._run("thread_release", keys, [run_id])) or None

    def thread_holder(self, tenant: str | None, thread_id: str) -> tuple[str, float]:
        """The run holding the thread ('' : none) and since when (Redis time, seconds)."""
        raw = self.redis.hmget(
            self.keys.thread_state(tenant, thread_id), protocol.THREAD_ACTIVE, protocol.THREAD_SINCE
        )
        return _s(raw[0] or b""), int(raw[1] or 0) / 1000

    def thread_waiting(self, tenant: str | None, thread_id: str) -> list[str]:
        """The runs waiting for the thread, in the order they will start."""
        return [_s(r) for r in self.redis.lrange(self.keys.thread_waiting(tenant, thread_id), 0, -1)]

    def rolled_back(self, tenant: str | None, thread_id: str) -> set[str]:
        """Runs of the thread rolled back: their messages are not part of its conversation."""
        return {_s(r) for r in self.redis.smembers(self.keys.thread_rolled_back(tenant, thread_id))}

    def park_for_thread(self, run_id: str, version: int, token: str, why: dict[str, Any]) -> bool:
        """Park the start claimed by ``token`` until the thread's previous run ends (False: the
        claim is no longer held)."""
        k = self.keys
        reply = self._run(
            "thread_park",
            [k.run(run_id), k.attempts(run_id), k.leases_of(run_id)],
            [run_id, version, token, json.dumps(why)],
        )
        return int(reply) == 1

    def wake_from_thread(self, run_id: str) -> bool:
        """Unpark a run waiting for its thread; True if it was parked (its start is to be published)."""
        k = self.keys
        reply = self._run("thread_wake", [k.run(run_id), k.leases_of(run_id)], [run_id, self._queued_ms])
        return int(reply) == 1

    def cancel_unparking(self, run_id: str) -> tuple[Phase | None, bool]:
        """Ask a run to stop (as :meth:`request_cancel`) and, if it is parked for its thread,
        unpark it in the same step: (its phase, True when its start is to be published now, to end
        it INTERRUPTED at once rather than when its turn comes)."""
        reply = self._run(
            "thread_cancel", [self.keys.run(run_id), self.keys.leases_of(run_id)], [run_id, self._queued_ms]
        )
        phase, woken = _s(reply[0]), int(reply[1])
        if not phase:
            archived = self.archive.load(run_id) if self.archive is not None else None
            return (archived.phase if archived is not None else None), False  # ended long ago, or none
        return Phase(phase), woken == 1

    def thread_wait(self, run_id: str) -> dict[str, Any] | None:
        """What a parked run waits for (``thread_id``, ``waiting_for``), None when it is not parked."""
        raw = self.redis.hget(self.keys.run(run_id), protocol.THREAD_WAIT)
        return None if raw is None else cast(dict[str, Any], json.loads(_s(raw)))

    def held_threads(self) -> Iterator[HeldThread]:
        """Every thread some run may hold (the sweeper's backstop reads each)."""
        for member, score in self.redis.zscan_iter(self.keys.threads_held(), count=200):
            tenant, thread_id = json.loads(_s(member))
            yield HeldThread(tenant, thread_id, _score(score))

    def forget_thread(self, thread: HeldThread) -> bool:
        """Drop a free thread from the registry unless it was touched since it was read."""
        member = _member(thread.tenant, thread.thread_id)
        return int(self._run("thread_forget", [self.keys.threads_held()], [member, thread.score])) == 1


def _member(tenant: str | None, thread_id: str) -> str:
    return json.dumps([tenant, thread_id])


def _score(score: Any) -> str:
    # As Redis spells it back (ZSCORE), so thread_forget.lua can compare: counters are integers.
    return str(int(float(score)))
