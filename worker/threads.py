"""The worker's side of threads and a second message (``shared/store/threads.py`` has the protocol).

* :func:`take_thread_turn` — the start phase admits its run to its thread under its policy: it
  starts, or is refused (``reject``: failed with ``ThreadBusy``), or stops the runs ahead of it
  (``interrupt``, ``rollback``) and parks until the one before it ends;
* :func:`hand_thread_on` — a run that ended gives the thread to the next waiting run and wakes it;
* :func:`repair_threads` — the sweeper's backstop for a hand-on or wake that was lost.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from shared import fsm
from shared.errors import ThreadBusy
from shared.state import Phase, RunHead, ThreadPolicy
from shared.store import ClaimRef
from shared.tasks import decide_task, start_task

if TYPE_CHECKING:
    from worker.runtime import Runtime

__all__ = ["ORPHAN_HOLDER_S", "hand_thread_on", "repair_threads", "stop_runs", "take_thread_turn", "wake"]

log = logging.getLogger("wesichain.worker")

#: A thread held by a run that does not exist is handed on after this: a submit admits its run to
#: the thread just before it creates the run, and may have died in between.
ORPHAN_HOLDER_S = 120.0


def take_thread_turn(
    rt: Runtime, current: fsm.Idle, claim: ClaimRef, agent_policy: ThreadPolicy
) -> tuple[bool, RunHead | None]:
    """Admit a starting run to its thread: (True, None) when it holds the thread and starts now;
    else (False, the head this delivery committed, if any): refused, or parked until its turn."""
    head = current.head
    assert head.thread_id is not None
    policy = head.thread_policy or agent_policy
    turn = rt.store.admit_to_thread(head.tenant, head.thread_id, head.run_id, policy)
    if turn.woken:
        _turn_came(rt, turn.woken)
    if turn.verdict == "busy":
        # A bare start message: nobody to answer, so the run records why it did not run.
        return False, rt.fail(current, claim, ThreadBusy(head.thread_id, turn.holder, step=0).info())
    stop_runs(rt, turn.ahead)  # again after the submit's: it may have died before it asked them
    if turn.verdict != "wait":
        return True, None
    why = {"thread_id": head.thread_id, "waiting_for": turn.previous}
    if not rt.store.park_for_thread(head.run_id, head.version, claim.token, why):
        return False, None  # taken over meanwhile: the new holder goes on
    log.info("run %s: waits for run %s of its thread to end", head.run_id, turn.previous)
    # The run before may have ended between the admission and the park, when this run was not
    # parked yet to be woken: look again now that it is.
    holder, _ = rt.store.thread_holder(head.tenant, head.thread_id)
    # Likewise a cancel asked before the park, which found nothing parked to end: end it now.
    if holder == head.run_id or rt.store.cancel_requested(head.run_id):
        wake(rt, head.run_id)
    return False, None


def stop_runs(rt: Runtime, run_ids: tuple[str, ...] | list[str]) -> None:
    """Ask runs ahead in a thread to stop (``interrupt``, ``rollback``): a running one at its next
    safe boundary (the same cancel as ``RunHandle.cancel``: never in the middle of a tool call), a
    waiting one as soon as its turn comes, before it starts; a parked approval is woken to end."""
    for run_id in run_ids:
        phase, woken = rt.store.cancel_unparking(run_id)
        if woken:
            _publish_start(rt, run_id)
        elif phase is Phase.AWAITING_APPROVAL:
            parked = rt.store.load(run_id)
            if parked is not None:
                rt.publish([decide_task(parked)], parked.epoch)


def wake(rt: Runtime, run_id: str) -> None:
    """Unpark a run whose turn in its thread came, and publish its start (once: only the call that
    unparks it publishes; from then on the sweeper watches the start like any queued task)."""
    if rt.store.wake_from_thread(run_id):
        _turn_came(rt, run_id)


def _turn_came(rt: Runtime, run_id: str) -> None:
    """``run_id`` was unparked by this call (its turn came): publish its start."""
    log.info("run %s: its turn in its thread came", run_id)
    _publish_start(rt, run_id)


def _publish_start(rt: Runtime, run_id: str) -> None:
    head = rt.store.load(run_id)
    if head is not None:
        rt.publish([start_task(run_id, namespace=head.namespace)], head.epoch)


def hand_thread_on(rt: Runtime, head: RunHead) -> None:
    """``head`` ended: the next run waiting for its thread holds it now, and is woken.

    Runs right after the terminal commit. Should it fail, or the process die first, the sweeper's
    :func:`repair_threads` finds the thread held by an ended run and does it.
    """
    if head.thread_id is None or head.fork is not None:
        return
    try:
        woken = rt.store.pass_thread_on(head.tenant, head.thread_id, head.run_id)
        if woken is not None:
            _turn_came(rt, woken)
    except Exception:
        log.exception("run %s: handing its thread on failed; the sweeper will", head.run_id)


def repair_threads(rt: Runtime) -> int:
    """The sweeper's backstop: every held thread whose holder ended (or never came to be) is handed
    on, and a holder still parked is woken. Returns how many threads it moved on."""
    store = rt.store
    moved = 0
    now = _redis_time(rt)
    for thread in store.held_threads():
        holder, since = store.thread_holder(thread.tenant, thread.thread_id)
        if not holder:
            if not store.thread_waiting(thread.tenant, thread.thread_id):
                store.forget_thread(thread)
            continue
        # The phase alone: every pass reads every held thread's holder, and a head holds its
        # whole conversation (990 parked runs of 31 KB each cost Redis 30 MB/s of replies).
        # A holder archived since is not in Redis: it ended, as one gone does.
        phase = store.phase_of(holder)
        if phase is None and now - since < ORPHAN_HOLDER_S:
            continue  # its submit may be creating it right now
        if phase is None or phase.terminal:
            woken = store.pass_thread_on(thread.tenant, thread.thread_id, holder)
            log.warning("thread %s: handed on from run %s (its hand-on was lost)", thread.thread_id, holder)
            moved += 1
            if woken is not None:
                _turn_came(rt, woken)
        elif phase is Phase.IDLE and store.thread_wait(holder) is not None:
            log.warning("run %s: woken for its thread %s (its wake was lost)", holder, thread.thread_id)
            wake(rt, holder)
            moved += 1
    return moved


def _redis_time(rt: Runtime) -> float:
    try:
        seconds, micros = rt.store.redis.time()
        return float(seconds) + micros / 1e6
    except Exception:
        return time.time()
