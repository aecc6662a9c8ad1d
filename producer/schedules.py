"""``client.schedules``: create, read, pause, resume and delete a tenant's schedules, and fire
their due ticks (what ``wesichain scheduler`` does, ``producer/scheduler.py``).

The state and what makes a tick fire once are in ``shared/schedules.py``. Firing a tick:

1. the newest due ticks (by the missed policy) are planned from Redis's time; a backlog beyond
   them is recorded as missed and the schedule moved past it (one compare-and-set);
2. the tick's decision (``run``, or ``skip`` when the overlap policy is ``skip`` and the previous
   scheduled run is still going) is recorded once, and followed by whoever fires the tick;
3. a ``run`` tick submits its run with the tick's idempotency key (the same run however often the
   tick is fired), ``check_agent=False`` so that a tick is never lost to a moment without workers
   (the run waits in the queue);
4. the schedule is advanced to its next tick and the tick's history entry written, once.

A scheduler that dies anywhere in between leaves the tick due: the next one to look fires it
again, and gets the same decision and the same run.
"""

from __future__ import annotations

import builtins
import logging
from typing import TYPE_CHECKING, Any

from shared.errors import InvalidRequest, ThreadBusy, WesichainError
from shared.request import check_name, validate_request
from shared.schedules import (
    HISTORY_MAX,
    MAX_CATCH_UP,
    MAX_FIRE_TIMES,
    MissedPolicy,
    OverlapPolicy,
    Schedule,
    ScheduleStore,
    ScheduleTick,
    Timing,
    due_plan,
    redis_now,
    tick_key,
)

if TYPE_CHECKING:
    from producer.client import Client

__all__ = ["MAX_TICKS_PER_PASS", "ScheduleNotFound", "Schedules"]

log = logging.getLogger("wesichain.scheduler")


class ScheduleNotFound(WesichainError, LookupError):
    """No schedule has this id for this tenant (never created, or deleted)."""


#: Ticks of one schedule fired in one pass at most (a backlog is worked over several passes).
MAX_TICKS_PER_PASS = 20


class Schedules:
    """A client's schedules; every call names the ``tenant`` (None: schedules without one)."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self.store = ScheduleStore(client.store.redis, client.store.keys)

    def create(
        self,
        agent: str,
        input: str,
        timing: Timing | dict[str, Any],
        *,
        tenant: str | None = None,
        metadata: dict[str, Any] | None = None,
        thread_id: str | None = None,
        assistant: str | None = None,
        missed: MissedPolicy = "skip",
        catch_up: int = 1,
        overlap: OverlapPolicy = "skip",
        check_agent: bool = True,
    ) -> Schedule:
        """A new schedule that starts a run of ``agent`` with ``input`` at every tick of
        ``timing`` (``{"cron": "*/5 * * * *", "timezone": "Europe/Paris"}`` or ``{"every_s": 60}``).

        ``missed``: after an outage (no scheduler, or Redis down), ``skip`` starts only the newest
        due tick, ``catch_up`` the newest ``catch_up`` ones, oldest first (older ones are recorded
        as missed). ``overlap``: while the previous scheduled run has not ended, ``skip`` starts no
        run for the tick (recorded as skipped), ``enqueue`` starts it to wait its turn in the
        schedule's thread (``thread_id``, or one of the schedule's own), ``allow`` starts it beside
        the other. Raises :class:`InvalidRequest` for a bad schedule or run request, and (with
        ``check_agent``) ``UnknownAgent``/``NoLiveWorker`` as ``submit`` does.
        """
        if tenant is not None:
            check_name("tenant", tenant)
        try:
            parsed = timing if isinstance(timing, Timing) else Timing.model_validate(timing)
        except ValueError as exc:
            raise InvalidRequest(f"bad timing: {_first_error(exc)}") from None
        if missed not in ("skip", "catch_up"):
            raise InvalidRequest(f"missed is skip or catch_up, not {str(missed)[:40]!r}")
        if overlap not in ("skip", "enqueue", "allow"):
            raise InvalidRequest(f"overlap is skip, enqueue or allow, not {str(overlap)[:40]!r}")
        if missed == "skip":
            catch_up = 1
        if not isinstance(catch_up, int) or not 1 <= catch_up <= MAX_CATCH_UP:
            raise InvalidRequest(f"catch_up must be in 1..{MAX_CATCH_UP}")
        if overlap == "allow" and thread_id is not None:
            raise InvalidRequest(
                "overlap allow starts runs beside each other, which one thread cannot hold: use enqueue"
                " with a thread_id, or allow without one"
            )
        fields: dict[str, Any] = {"agent": agent, "input": input}
        for name, value in (
            ("metadata", metadata),
            ("thread_id", thread_id),
            ("tenant", tenant),
            ("assistant", assistant),
        ):
            if value is not None:
                fields[name] = value
        request = validate_request(fields, self._client.settings.limits)
        request, pinned = self._client.assistants.store.pin(request)  # the assistant exists
        if check_agent:
            self._client._check_agent(request.agent, request.metadata, pinned)
        now = int(redis_now(self.store.redis))
        parsed = parsed.anchored(now)
        schedule = Schedule(
            schedule_id=self.store.new_id(),
            tenant=tenant,
            agent=request.agent,
            input=request.input,
            metadata=request.metadata,
            thread_id=thread_id,
            assistant=assistant,
            timing=parsed,
            missed=missed,
            catch_up=catch_up,
            overlap=overlap,
            created_at=float(now),
            next_fire=parsed.next_after(now),
        )
        return self.store.create(schedule)

    def get(self, schedule_id: str, *, tenant: str | None = None) -> Schedule:
        """The schedule; raises :class:`ScheduleNotFound` (also for another tenant's)."""
        found = self.store.load(tenant, _checked_id(schedule_id))
        if found is None:
            raise ScheduleNotFound(f"no schedule {schedule_id[:80]!r}")
        return found

    def list(self, *, tenant: str | None = None) -> builtins.list[Schedule]:
        """The tenant's schedules, oldest first."""
        return self.store.list_schedules(tenant)

    def pause(self, schedule_id: str, *, tenant: str | None = None) -> Schedule:
        """Stop firing until resumed; runs already started go on."""
        if not self.store.pause(tenant, _checked_id(schedule_id)):
            raise ScheduleNotFound(f"no schedule {schedule_id[:80]!r}")
        return self.get(schedule_id, tenant=tenant)

    def resume(self, schedule_id: str, *, tenant: str | None = None) -> Schedule:
        """Fire again from the next tick after now: ticks that passed while paused are not started."""
        schedule = self.get(schedule_id, tenant=tenant)
        if not schedule.paused:
            return schedule
        next_fire = schedule.timing.next_after(int(redis_now(self.store.redis)))
        if not self.store.resume(tenant, schedule_id, next_fire):
            raise ScheduleNotFound(f"no schedule {schedule_id[:80]!r}")
        return self.get(schedule_id, tenant=tenant)

    def delete(self, schedule_id: str, *, tenant: str | None = None) -> None:
        """Delete the schedule and its history; the runs it started go on."""
        if not self.store.delete(tenant, _checked_id(schedule_id)):
            raise ScheduleNotFound(f"no schedule {schedule_id[:80]!r}")

    def next_fire_times(
        self, schedule_id: str, n: int = 5, *, tenant: str | None = None
    ) -> builtins.list[int]:
        """The schedule's next ``n`` ticks (Unix seconds); none while it is paused."""
        if not 1 <= n <= MAX_FIRE_TIMES:
            raise InvalidRequest(f"n must be in 1..{MAX_FIRE_TIMES}")
        schedule = self.get(schedule_id, tenant=tenant)
        if schedule.next_fire is None:
            return []
        ticks = schedule.timing.ticks_from(schedule.next_fire)
        return [next(ticks) for _ in range(n)]

    def runs(
        self, schedule_id: str, limit: int = HISTORY_MAX, *, tenant: str | None = None
    ) -> builtins.list[ScheduleTick]:
        """The schedule's newest ticks, newest first, each with its run's status now."""
        self.get(schedule_id, tenant=tenant)
        ticks = self.store.history(tenant, schedule_id, max(1, min(limit, HISTORY_MAX)))
        out = []
        for tick in ticks:
            status = None
            if tick.run_id is not None:
                head = self._client.store.load(tick.run_id)
                status = head.status if head is not None else "ended"
            out.append(tick.model_copy(update={"status": status}))
        return out

    # -- firing ------------------------------------------------------------------------------------

    def fire_due(self, tenant: str | None, schedule_id: str) -> int:
        """Fire the schedule's due ticks (at most :data:`MAX_TICKS_PER_PASS`); how many were
        handled. Safe to call from any number of processes at once."""
        handled = 0
        while handled < MAX_TICKS_PER_PASS:
            schedule = self.store.load(tenant, schedule_id)
            if schedule is None:
                self.store.forget_due(tenant, schedule_id)
                return handled
            if schedule.next_fire is None:  # paused
                return handled
            now_f = redis_now(self.store.redis)
            now = int(now_f)
            tick = schedule.next_fire
            plan = due_plan(schedule.timing, tick, now, schedule.keep)
            if plan is None:
                return handled
            first, missed = plan
            if missed:
                entry = ScheduleTick(tick=tick, outcome="missed", missed=missed, at=now_f)
                self.store.advance(tenant, schedule_id, tick, first, entry)
                log.warning("schedule %s: %d missed ticks passed over (from %d)", schedule_id, missed, tick)
                handled += 1
                continue
            self._fire(schedule, tick, now_f)
            handled += 1
        return handled

    def _fire(self, schedule: Schedule, tick: int, now: float) -> None:
        tenant, schedule_id = schedule.tenant, schedule.schedule_id
        decision = "run"
        if schedule.overlap == "skip" and schedule.last_run_id is not None:
            previous = self._client.store.load(schedule.last_run_id)
            if previous is not None and not previous.phase.terminal:
                decision = "skip"
        held = self.store.decide(tenant, schedule_id, tick, decision)
        if held is None:
            return  # fired by another scheduler, paused or deleted meanwhile
        next_tick = schedule.timing.next_after(tick)
        if held == "skip":
            entry = ScheduleTick(
                tick=tick,
                outcome="skipped",
                reason=f"the previous run {schedule.last_run_id} had not ended",
                at=now,
            )
        else:
            entry = self._start(schedule, tick, now)
        if self.store.advance(tenant, schedule_id, tick, next_tick, entry):
            log.info("schedule %s: tick %d %s %s", schedule_id, tick, entry.outcome, entry.run_id or "")

    def _start(self, schedule: Schedule, tick: int, now: float) -> ScheduleTick:
        """The tick's run (the same one however often this is called); transient failures (Redis,
        the broker, memory) raise, leaving the tick due, and a refused request is recorded."""
        from producer.client import RequestConflict

        thread = schedule.run_thread
        try:
            handle = self._client.submit(
                schedule.agent,
                schedule.input,
                thread_id=thread,
                metadata=schedule.metadata or None,
                tenant=schedule.tenant,
                idempotency_key=tick_key(schedule.schedule_id, tick),
                check_agent=False,
                thread_policy="enqueue" if thread is not None else None,
                assistant=schedule.assistant,
            )
        except (InvalidRequest, RequestConflict, ThreadBusy) as exc:
            return ScheduleTick(tick=tick, outcome="failed", reason=str(exc)[:300], at=now)
        return ScheduleTick(tick=tick, outcome="started", run_id=handle.run_id, at=now)


def _checked_id(schedule_id: str) -> str:
    if not isinstance(schedule_id, str) or not schedule_id.isalnum() or len(schedule_id) > 64:
        raise ScheduleNotFound(f"no schedule {str(schedule_id)[:80]!r}")
    return schedule_id


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"{where + ': ' if where else ''}{first.get('msg', '')}"[:300]
    return str(exc)[:300]
