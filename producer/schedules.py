"""``client.schedules``: create, read, change, pause, resume and delete a tenant's schedules, and
fire their due ticks (what ``wesichain scheduler`` does, ``producer/scheduler.py``).

The state and what makes a tick fire once are in ``shared/schedules.py``. Firing a tick:

1. the newest due ticks (by the missed policy) are planned from Redis's time; a backlog beyond
   them is recorded as missed and the schedule moved past it (one compare-and-set);
2. the tick's decision (``run``, or ``skip`` when the overlap policy is ``skip`` and the previous
   scheduled run is still going) is recorded once, and followed by whoever fires the tick;
3. a ``run`` tick submits its run with the tick's idempotency key (the same run however often the
   tick is fired), ``check_agent=False`` so that a tick is never lost to a moment without workers
   (the run waits in the queue); a pipeline schedule's tick submits the pipeline run
   :func:`~shared.schedules.tick_pipeline_id` (the same one however often), unchecked likewise;
4. the schedule is advanced to its next tick and the tick's history entry written, once.

A scheduler that dies anywhere in between leaves the tick due: the next one to look fires it
again, and gets the same decision and the same run. A tick with a recorded decision is fired to
its end first, before any backlog is judged, whatever happened meanwhile (a pause and resume, an
outage, a changed timing): no tick starts a run without its history entry.

Pipeline runs have no threads, so a pipeline schedule's ``enqueue`` keeps the tick due (undecided)
until the previous pipeline run ended; the missed policy bounds what piles up meanwhile.
"""

from __future__ import annotations

import builtins
import functools
import logging
from typing import TYPE_CHECKING, Any

from producer.admission import Admissions, Reservation, TenantLimited
from shared.errors import ConfigError, InvalidRequest, ThreadBusy, WesichainError
from shared.pipeline.store import PipelineStore, stored_pipeline_id
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
    tick_pipeline_id,
)
from shared.tenants import Tenants, check_models_allowed

if TYPE_CHECKING:
    from producer.client import Client

__all__ = ["MAX_TICKS_PER_PASS", "ScheduleNotFound", "SchedulerHooks", "Schedules", "check_until_change"]

log = logging.getLogger("wesichain.scheduler")


class ScheduleNotFound(WesichainError, LookupError):
    """No schedule has this id for this tenant (never created, or deleted)."""


#: Ticks of one schedule fired in one pass at most (a backlog is worked over several passes).
MAX_TICKS_PER_PASS = 20
#: Tries of an update that raced another update of the same schedule.
_UPDATE_TRIES = 5


class SchedulerHooks:
    """Called by whoever fires ticks, the scheduler loop's extension points. ``Settings.hooks``
    may name a subclass (fault injection, ``worker.testing.faults``, dies at an exact point with
    it). The defaults do nothing."""

    def after_tick_submitted(
        self, store: ScheduleStore, schedule: Schedule, tick: int, entry: ScheduleTick
    ) -> None:
        """A ``run`` tick's run (or pipeline run) was submitted; the schedule is not advanced yet."""


class Schedules:
    """A client's schedules; every call names the ``tenant`` (None: schedules without one)."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self.store = ScheduleStore(client.store.redis, client.store.keys)
        #: What firing calls at its extension points (the scheduler installs ``Settings.hooks``).
        self.hooks = SchedulerHooks()

    def create(
        self,
        agent: str | None,
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
        pipeline: str | None = None,
        until: int | None = None,
        allowed_models: tuple[str, ...] | None = None,
    ) -> Schedule:
        """A new schedule that starts a run of ``agent`` with ``input`` at every tick of
        ``timing`` (``{"cron": "*/5 * * * *", "timezone": "Europe/Paris"}`` or ``{"every_s": 60}``),
        or, with ``pipeline`` (and ``agent`` None), a pipeline run of the agents module's pipeline.
        ``until`` (Unix seconds) is an end date: no tick after it fires.

        ``missed``: after an outage (no scheduler, or Redis down), ``skip`` starts only the newest
        due tick, ``catch_up`` the newest ``catch_up`` ones, oldest first (older ones are recorded
        as missed). ``overlap``: while the previous scheduled run has not ended, ``skip`` starts no
        run for the tick (recorded as skipped), ``enqueue`` starts it to wait its turn in the
        schedule's thread (``thread_id``, or one of the schedule's own; a pipeline schedule's tick
        waits, due, until the previous pipeline run ended), ``allow`` starts it beside the other.
        Raises :class:`InvalidRequest` for a bad schedule or run request, and (with
        ``check_agent``) ``UnknownAgent``/``NoLiveWorker`` as ``submit`` does, ``UnknownPipeline``
        or an input the pipeline cannot take as ``submit_pipeline`` does. ``allowed_models`` as
        for ``submit``: the assistant's model (checked again at every tick).
        """
        if tenant is not None:
            check_name("tenant", tenant)
        parsed = _timing(timing)
        catch_up = _check_policies(missed, catch_up, overlap)
        if (agent is None) == (pipeline is None):
            raise InvalidRequest("a schedule starts runs of an agent or pipeline runs: give one of the two")
        if overlap == "allow" and thread_id is not None:
            raise InvalidRequest(
                "overlap allow starts runs beside each other, which one thread cannot hold: use enqueue"
                " with a thread_id, or allow without one"
            )
        now = int(redis_now(self.store.redis))
        _check_until(until, now)
        if pipeline is not None:
            given = [
                n
                for n, v in (("metadata", metadata), ("thread_id", thread_id), ("assistant", assistant))
                if v
            ]
            if given:
                raise InvalidRequest(
                    f"a pipeline schedule takes no {', '.join(given)}: pipeline runs have none"
                )
            from producer.pipelines import check_pipeline_request

            try:
                check_pipeline_request(self._client, pipeline, input, tenant=tenant, check=check_agent)
            except ConfigError:
                # This process cannot import the agents module (an API without it): the workers
                # check each pipeline run, and an unknown pipeline fails it (UnknownPipeline).
                check_pipeline_request(self._client, pipeline, input, tenant=tenant, check=False)
            parsed = parsed.anchored(now)
            return self.store.create(
                Schedule(
                    schedule_id=self.store.new_id(),
                    tenant=tenant,
                    pipeline=pipeline,
                    input=input,
                    timing=parsed,
                    missed=missed,
                    catch_up=catch_up,
                    overlap=overlap,
                    until=until,
                    created_at=float(now),
                    next_fire=_starting_tick(parsed, now, until),
                )
            )
        assert agent is not None
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
        check_models_allowed(tenant, allowed_models, pinned.config.model if pinned is not None else None)
        if check_agent:
            self._client._check_agent(request.agent, request.metadata, pinned)
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
            until=until,
            created_at=float(now),
            next_fire=_starting_tick(parsed, now, until),
        )
        return self.store.create(schedule)

    def update(
        self,
        schedule_id: str,
        *,
        tenant: str | None = None,
        timing: Timing | dict[str, Any] | None = None,
        input: str | None = None,
        metadata: dict[str, Any] | None = None,
        missed: MissedPolicy | None = None,
        catch_up: int | None = None,
        overlap: OverlapPolicy | None = None,
        until: int | None = None,
        clear_until: bool = False,
    ) -> Schedule:
        """Change what is given (None keeps it; ``clear_until`` removes the end date).

        A new timing or end date recomputes the next tick from now, in the same atomic write as
        the change: the old timing's ticks that have not fired never do. A tick being fired right
        now (its decision recorded) ends as it was decided, and the schedule moves on from it by
        the new timing. A new end date may end a schedule, or bring an ended one back. The agent
        or pipeline, thread and assistant stay (a schedule of another is another schedule).
        Raises :class:`ScheduleNotFound`, or :class:`InvalidRequest` (nothing is written then).
        """
        check_until_change(until, clear_until)
        new_timing = _timing(timing) if timing is not None else None
        for _ in range(_UPDATE_TRIES):
            current = self.get(schedule_id, tenant=tenant)
            expected = self.store.spec_of(tenant, schedule_id)
            if expected is None:
                break
            changes: dict[str, Any] = {}
            if missed is not None or catch_up is not None or overlap is not None:
                new_missed = missed if missed is not None else current.missed
                new_overlap = overlap if overlap is not None else current.overlap
                new_catch_up = catch_up if catch_up is not None else current.catch_up
                changes["catch_up"] = _check_policies(new_missed, new_catch_up, new_overlap)
                changes["missed"], changes["overlap"] = new_missed, new_overlap
                if new_overlap == "allow" and current.thread_id is not None:
                    raise InvalidRequest("overlap allow cannot share the schedule's one thread: use enqueue")
            if input is not None or metadata is not None:
                changes.update(self._checked_content(current, input, metadata))
            now = int(redis_now(self.store.redis))
            if until is not None:
                _check_until(until, now)
                changes["until"] = until
            elif clear_until:
                changes["until"] = None
            if new_timing is not None:
                changes["timing"] = new_timing.anchored(now)
            updated = current.model_copy(update=changes)
            next_tick = None
            if new_timing is not None or "until" in changes:
                next_tick = _first_tick(updated.timing, now, updated.until)
            reply = self.store.update(updated, expected, next_tick)
            if reply == "ok":
                return self.get(schedule_id, tenant=tenant)
            if reply == "missing":
                break
        else:
            raise InvalidRequest("the schedule kept changing under this update: try again")
        raise ScheduleNotFound(f"no schedule {schedule_id[:80]!r}")

    def _checked_content(
        self, current: Schedule, input: str | None, metadata: dict[str, Any] | None
    ) -> dict[str, Any]:
        """A new input and metadata, checked as a run's (or pipeline run's) request is."""
        new_input = input if input is not None else current.input
        if current.pipeline is not None:
            if metadata:
                raise InvalidRequest("a pipeline schedule takes no metadata: pipeline runs have none")
            from producer.pipelines import check_pipeline_request

            check_pipeline_request(
                self._client, current.pipeline, new_input, tenant=current.tenant, check=False
            )
            return {"input": new_input}
        fields: dict[str, Any] = {"agent": current.agent, "input": new_input}
        new_metadata = metadata if metadata is not None else current.metadata
        if new_metadata:
            fields["metadata"] = new_metadata
        if current.tenant is not None:
            fields["tenant"] = current.tenant
        request = validate_request(fields, self._client.settings.limits)
        return {"input": request.input, "metadata": request.metadata}

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
        """Stop firing until resumed; runs already started go on (and a tick being fired right now
        ends as it was decided, with its history entry)."""
        if not self.store.pause(tenant, _checked_id(schedule_id)):
            raise ScheduleNotFound(f"no schedule {schedule_id[:80]!r}")
        return self.get(schedule_id, tenant=tenant)

    def resume(self, schedule_id: str, *, tenant: str | None = None) -> Schedule:
        """Fire again from the next tick after now: ticks that passed while paused are not started
        (except one decided before the pause and not yet ended, which is fired first)."""
        schedule = self.get(schedule_id, tenant=tenant)
        if not schedule.paused:
            return schedule
        now = int(redis_now(self.store.redis))
        next_fire = _first_tick(schedule.timing, now, schedule.until)
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
        """The schedule's next ``n`` ticks (Unix seconds), up to its end date; none while it is
        paused or after it ended."""
        if not 1 <= n <= MAX_FIRE_TIMES:
            raise InvalidRequest(f"n must be in 1..{MAX_FIRE_TIMES}")
        schedule = self.get(schedule_id, tenant=tenant)
        if schedule.next_fire is None:
            return []
        out: builtins.list[int] = []
        for tick in schedule.timing.ticks_from(schedule.next_fire):
            if len(out) == n or (schedule.until is not None and tick > schedule.until):
                break
            out.append(tick)
        return out

    def runs(
        self, schedule_id: str, limit: int = HISTORY_MAX, *, tenant: str | None = None
    ) -> builtins.list[ScheduleTick]:
        """The schedule's newest ticks, newest first, each with its run's (or pipeline run's)
        status now."""
        self.get(schedule_id, tenant=tenant)
        ticks = self.store.history(tenant, schedule_id, max(1, min(limit, HISTORY_MAX)))
        out = []
        for tick in ticks:
            status: str | None = None
            if tick.run_id is not None:
                head = self._client.store.load(tick.run_id)
                status = head.status if head is not None else "ended"
            elif tick.pipeline_id is not None:
                meta = self._pipelines().meta(stored_pipeline_id(tenant, tick.pipeline_id))
                status = meta.status if meta is not None else "ended"
            out.append(tick.model_copy(update={"status": status}))
        return out

    def _pipelines(self) -> PipelineStore:
        client = self._client
        return PipelineStore(client.store.redis, client.store.keys, client.settings.retention_s)

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
            if schedule.next_fire is None:  # paused, or ended
                return handled
            now_f = redis_now(self.store.redis)
            tick = schedule.next_fire
            if self.store.decision(tenant, schedule_id, tick) is not None:
                # In flight: a scheduler decided it and may have submitted its run, then died or
                # was overtaken by a pause and resume; it ends before anything else is judged.
                if not self._fire(schedule, tick, now_f):
                    return handled
                handled += 1
                continue
            horizon = int(now_f) if schedule.until is None else min(int(now_f), schedule.until)
            plan = due_plan(schedule.timing, tick, horizon, schedule.keep)
            if plan is None:
                return handled
            first, missed = plan
            if missed:
                entry = ScheduleTick(tick=tick, outcome="missed", missed=missed, at=now_f)
                self.store.advance(tenant, schedule_id, tick, first, entry)
                log.warning("schedule %s: %d missed ticks passed over (from %d)", schedule_id, missed, tick)
                handled += 1
                continue
            if not self._fire(schedule, tick, now_f):
                return handled  # waits its turn (a pipeline schedule's enqueue)
            handled += 1
        return handled

    def _fire(self, schedule: Schedule, tick: int, now: float) -> bool:
        """Decide, start and advance one tick; False when the tick stays due for now."""
        tenant, schedule_id = schedule.tenant, schedule.schedule_id
        decision = "run"
        if schedule.overlap != "allow" and self._previous_going(schedule):
            if schedule.overlap == "skip":
                decision = "skip"
            elif schedule.pipeline is not None and self.store.decision(tenant, schedule_id, tick) is None:
                return False  # enqueue without a thread: the tick waits, due, for the previous to end
        held = self.store.decide(tenant, schedule_id, tick, decision)
        if held is None:
            return True  # fired by another scheduler, paused or deleted meanwhile
        next_tick = schedule.timing.next_after(tick)
        if schedule.until is not None and next_tick > schedule.until:
            next_tick = 0
        if held == "skip":
            previous = schedule.last_run_id or schedule.last_pipeline_id
            entry = ScheduleTick(
                tick=tick, outcome="skipped", reason=f"the previous run {previous} had not ended", at=now
            )
        else:
            entry = self._start(schedule, tick, now)
            self.hooks.after_tick_submitted(self.store, schedule, tick, entry)
        if self.store.advance(tenant, schedule_id, tick, next_tick, entry, decision=held):
            started = entry.run_id or entry.pipeline_id or ""
            log.info("schedule %s: tick %d %s %s", schedule_id, tick, entry.outcome, started)
        return True

    def _previous_going(self, schedule: Schedule) -> bool:
        """Whether the schedule's last started run (or pipeline run) has not ended."""
        if schedule.pipeline is not None:
            if schedule.last_pipeline_id is None:
                return False
            meta = self._pipelines().meta(stored_pipeline_id(schedule.tenant, schedule.last_pipeline_id))
            return meta is not None and not meta.terminal
        if schedule.last_run_id is None:
            return False
        previous = self._client.store.load(schedule.last_run_id)
        return previous is not None and not previous.phase.terminal

    def _start(self, schedule: Schedule, tick: int, now: float) -> ScheduleTick:
        """The tick's run (the same one however often this is called); transient failures (Redis,
        the broker, memory) raise, leaving the tick due, and a refused request is recorded."""
        try:
            reservation = self._admitted(schedule, tick)
        except TenantLimited as exc:
            # At its limits the tenant starts nothing more, by the API or by its schedules.
            return ScheduleTick(
                tick=tick, outcome="failed", reason=f"{exc.kind}: {exc.message}"[:300], at=now
            )
        try:
            return self._submit(schedule, tick, now)
        finally:
            self._admissions.release(reservation)

    def _admitted(self, schedule: Schedule, tick: int) -> Reservation | None:
        """The tick's place under its tenant's limits, as an API submit takes one (None: a
        schedule without a tenant, or a tick whose run a scheduler that died started already)."""
        from producer.client import idempotent_run_id

        tenant = schedule.tenant
        if tenant is None:
            return None
        store = self._client.store
        if schedule.pipeline is not None:
            stored = stored_pipeline_id(tenant, tick_pipeline_id(schedule.schedule_id, tick))
            made = PipelineStore(store.redis, store.keys).meta(stored) is not None
        else:
            run_id = idempotent_run_id(tenant, tick_key(schedule.schedule_id, tick))
            made = bool(store.redis.exists(store.keys.run(run_id)))
        if made:
            return None
        return self._admissions.reserve(tenant, Tenants(store.redis, store.keys).limits(tenant))

    @functools.cached_property
    def _admissions(self) -> Admissions:
        return Admissions(self._client.store)

    def _submit(self, schedule: Schedule, tick: int, now: float) -> ScheduleTick:
        from producer.client import RequestConflict
        from producer.pipelines import PipelineConflict

        if schedule.pipeline is not None:
            pipeline_id = tick_pipeline_id(schedule.schedule_id, tick)
            try:
                self._client.submit_pipeline(
                    schedule.pipeline,
                    schedule.input,
                    pipeline_id=pipeline_id,
                    tenant=schedule.tenant,
                    check=False,
                )
            except PipelineConflict:
                # Its id is taken: by this very tick, submitted before the schedule's input changed.
                pass
            except InvalidRequest as exc:
                return ScheduleTick(tick=tick, outcome="failed", reason=str(exc)[:300], at=now)
            return ScheduleTick(tick=tick, outcome="started", pipeline_id=pipeline_id, at=now)
        thread = schedule.run_thread
        assert schedule.agent is not None
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
                allowed_models=self._allowed_models(schedule),
            )
        except (InvalidRequest, RequestConflict, ThreadBusy) as exc:
            return ScheduleTick(tick=tick, outcome="failed", reason=str(exc)[:300], at=now)
        return ScheduleTick(tick=tick, outcome="started", run_id=handle.run_id, at=now)

    def _allowed_models(self, schedule: Schedule) -> tuple[str, ...] | None:
        """The models a tick's run may take from its assistant: its tenant's allowed ones now (a
        model taken back since the schedule was made fails the tick, ``ModelNotAllowed``)."""
        if schedule.tenant is None or schedule.assistant is None:
            return None  # a schedule names no model of its own: only its assistant can
        return Tenants(self._client.store.redis, self._client.store.keys).models(schedule.tenant)


def check_until_change(until: int | None, clear_until: bool) -> None:
    """An update sets a new end date or removes it, not both (here and over the HTTP API)."""
    if until is not None and clear_until:
        raise InvalidRequest("give until or clear_until, not both")


def _timing(timing: Timing | dict[str, Any]) -> Timing:
    try:
        return timing if isinstance(timing, Timing) else Timing.model_validate(timing)
    except ValueError as exc:
        raise InvalidRequest(f"bad timing: {_first_error(exc)}") from None


def _check_policies(missed: Any, catch_up: Any, overlap: Any) -> int:
    """The ``catch_up`` the policies come to (1 under ``skip``); raises for a bad one."""
    if missed not in ("skip", "catch_up"):
        raise InvalidRequest(f"missed is skip or catch_up, not {str(missed)[:40]!r}")
    if overlap not in ("skip", "enqueue", "allow"):
        raise InvalidRequest(f"overlap is skip, enqueue or allow, not {str(overlap)[:40]!r}")
    if missed == "skip":
        return 1
    if not isinstance(catch_up, int) or isinstance(catch_up, bool) or not 1 <= catch_up <= MAX_CATCH_UP:
        raise InvalidRequest(f"catch_up must be in 1..{MAX_CATCH_UP}")
    return catch_up


def _check_until(until: Any, now: int) -> None:
    if until is None:
        return
    if not isinstance(until, int) or isinstance(until, bool) or not now < until <= 2**40:
        raise InvalidRequest("until is a Unix time in seconds, after now")


def _first_tick(timing: Timing, now: int, until: int | None) -> int:
    """The first tick after ``now``, or 0 (no more ticks) when it would fall after ``until``."""
    tick = timing.next_after(now)
    return 0 if until is not None and tick > until else tick


def _starting_tick(timing: Timing, now: int, until: int | None) -> int:
    """A new schedule's first tick; refuses an end date before it."""
    tick = _first_tick(timing, now, until)
    if tick == 0:
        raise InvalidRequest("until is before the schedule's first tick: it would never fire")
    return tick


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
