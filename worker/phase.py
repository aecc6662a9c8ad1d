"""The one order every phase task follows (start, think, observe, decide; tools in ``act.py``).

1. Claim the phase in Redis (one round trip): a delivery that finds the run elsewhere, or the work
   held by another live claim, does nothing (see ``Runtime.on_unclaimed``).
2. Past the attempt limit, fail the run as poison instead of crashing another worker on it.
3. A cancel requested before the phase started ends the run now.
4. A run pinned to an agent version not served here is given back to its version queue; one this
   code takes over is carried forward by the phase's commit (``worker/versions.py``).
5. Do the phase under a heartbeat that keeps the claim alive, then commit as the claim's holder.

An exception the runtime did not expect is a bug, not a crash: it ends the run at once as
``InternalInvariant`` with the exception and a short traceback, and the task is done. Only Redis
trouble (and the process dying) leaves the phase to its lease, to be handed on by the sweeper.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis

from shared import fsm
from shared.state import RunHead
from shared.store import Claim, PhaseClaim
from worker.full import until_room
from worker.heartbeat import Held
from worker.logs import annotate
from worker.runtime import Cancelled, Delivery, Runtime, internal_error, poison_error
from worker.versions import check_version

__all__ = ["PhaseBody", "run_phase"]

log = logging.getLogger("wesichain.worker")

P = TypeVar("P", fsm.Idle, fsm.Thinking, fsm.Observing, fsm.Parked)

#: A phase's work: given the claimed view, the claim and its heartbeat, it commits and returns the
#: head it committed (None if it committed nothing).
PhaseBody = Callable[[P, Claim, Held], RunHead | None]


def _span_attributes(claim: Claim, want: PhaseClaim) -> dict[str, object]:
    head = claim.head
    return {
        "wesichain.step": want.step,
        "wesichain.phase": want.phase.value,
        "wesichain.agent": head.agent,
        "wesichain.tenant": head.tenant,
        "wesichain.attempt": claim.attempts,
        "wesichain.version": want.version,
    }


def run_phase(
    rt: Runtime,
    delivery: Delivery,
    want: PhaseClaim,
    what: str,
    view: type[P],
    body: PhaseBody[P],
) -> RunHead | None:
    """Claim, check and do one phase; returns the head this delivery committed, if any."""
    outcome = until_room(lambda: rt.store.claim_phase(want, rt.holder()), f"the claim of {want.run_id}")
    if not isinstance(outcome, Claim):
        rt.on_unclaimed(outcome, delivery)
        return None
    current = fsm.view_as(outcome.head, view)
    claim = outcome.ref
    if outcome.attempts == 1 and outcome.prior == "none":
        rt.metrics.waited(delivery.task, time.time() - outcome.head.updated_at, outcome.head.namespace)
    limit = rt.settings.max_phase_attempts
    if outcome.attempts > limit:
        error = poison_error(what, want.phase, want.step, outcome.attempts, limit, outcome.last_error)
        log.error("run %s: %s", want.run_id, error.message)
        return rt.fail(current, claim, error)
    if outcome.cancel_requested:
        return rt.interrupt(current, claim, "cancelled")
    checked = check_version(rt, current, outcome)
    if not checked.run:
        return checked.head
    current = checked.current
    annotate(tenant=outcome.head.tenant, step=want.step, phase=want.phase.value)
    started = time.perf_counter()
    with (
        rt.heartbeat.hold(want.run_id, outcome.field, outcome.token) as held,
        rt.tracing.span(f"wesichain.{want.phase.value}", want.run_id, **_span_attributes(outcome, want)),
    ):
        rt.hooks.on_claimed(want.phase, want.run_id, rt.store)
        try:
            return body(current, outcome, held)
        except Cancelled:
            return rt.interrupt(current, claim, "cancelled")
        except redis.RedisError:
            raise  # Redis trouble is not the run's fault: the lease hands the phase on
        except Exception as exc:
            log.exception("run %s: %s failed with an unexpected error", want.run_id, what)
            return rt.fail(current, claim, internal_error(exc, what, want.phase, want.step))
        finally:
            rt.carried.pop(want.run_id, None)  # committed with its phase, or not at all
            rt.metrics.phase_done(want.phase, time.perf_counter() - started)
