"""The pool drives pipeline runs: start each step's child runs within its cap, learn when each
ends, move on, fail or finish; repair what a dead process left.

* ``wesichain.pipeline.advance`` moves a pipeline run on from a step that is done (or from its
  start): it computes the next step's items from the values so far (resolving branches), moves on
  once (a script), and starts the step's first child runs;
* ``wesichain.pipeline.child`` is every child run's completion callback: it records how the child
  ended (once), retries it or fails the pipeline per the step's policy, and starts the next items,
  or moves on when the step is done;
* the sweeper's :meth:`PipelinePool.tick` repairs: an item taken whose child run was never created
  (its creator died), a child that ended with nobody told (the callback lost), a step done that
  never moved on, a step with room and nothing starting more, an ended pipeline whose live children
  were not all cancelled.

No worker waits for a child: between two of these tasks a pipeline run is only state in Redis.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from producer.admission import Admissions, Reservation, TenantLimited
from producer.client import Client, RunRequest
from shared.agents import AgentRegistry
from shared.errors import ConfigError, InvalidRequest, StoreFull, WesichainError
from shared.pipeline.definition import Step
from shared.pipeline.store import ItemToStart, PipelineMeta, PipelineStore, PumpLease, child_run_id
from shared.pipeline.tasks import CHILD_CALLBACK
from shared.pipeline.values import as_input, jsonable, value_of
from shared.state import Phase, PipelineLink, RunHead, TaskSpec
from shared.tenants import Tenants

__all__ = ["MAX_ITEMS", "PUMP_BATCH", "PUMP_LEASE_MS", "PUMP_ROUNDS", "PipelinePool", "StepError"]

log = logging.getLogger("wesichain.pipelines")

#: Items one map step may have.
MAX_ITEMS = 10_000
#: Items one pump takes at a time (it loops until the cap or the items run out).
PUMP_BATCH = 50
#: How long a step's pump lease lasts past its holder's last take: the wait, after a holder died,
#: before another end takes the room (the sweeper's repair takes it otherwise).
PUMP_LEASE_MS = 2000
#: Takes after which the holder of a step's pump lease hands it on (to the record of a live child),
#: so that one callback does not pump a long step all by itself.
PUMP_ROUNDS = 32


class StepError(Exception):
    """A step cannot be set up: a mapping function failed or gave something unusable."""


class PipelinePool:
    """What the pool does for pipeline runs, on the run store's Redis; ``client`` creates children."""

    def __init__(self, client: Client, agents: AgentRegistry, send: Callable[[TaskSpec], None]) -> None:
        self.client = client
        self.agents = agents
        self.send = send
        self.runs = client.store
        self.store = PipelineStore(
            client.store.redis, client.store.keys, client.settings.retention_s, client.store.connections
        )
        #: How long an ended child may wait for its callback before the sweeper records it.
        self.grace_s = max(10.0, client.settings.lease_s * 2)
        #: Steps taken, by (pipeline id, its creation time, seq): see :meth:`_step_of`.
        self._steps: dict[tuple[str, float, int], Step] = {}
        #: Pipeline runs as read before, by id: see :meth:`child_run_ended`.
        self._known: dict[str, PipelineMeta] = {}
        #: A tenant's child runs take their places under its limits as its submits do.
        self.admissions = Admissions(client.store)
        self.tenants = Tenants(client.store.redis, client.store.keys)

    # -- moving on ---------------------------------------------------------------------------------

    def advance(self, pipeline_id: str, from_seq: int) -> None:
        """Move on from step ``from_seq`` once it is done (-1: start); then start the next step."""
        meta = self.store.meta(pipeline_id)
        if meta is None or meta.terminal:
            return
        if meta.seq != from_seq:
            if meta.seq > from_seq:
                self.pump(pipeline_id, meta.seq)  # moved on already: make sure it is going
            return
        if from_seq >= 0 and meta.done != meta.total:
            return
        try:
            value = self._value(meta)
            target, index, via = self._next(meta, value)
        except ConfigError as exc:  # a pipeline (or a branch's case) the workers do not know
            self._fail(meta, {"kind": "UnknownPipeline", "message": str(exc)[:2000]})
            return
        except StepError as exc:
            self._fail(meta, {"kind": "PipelineStepError", "message": str(exc)[:2000]})
            return
        if target is None:
            if self.store.end(pipeline_id, from_seq, "completed", output=jsonable(value)) == "ok":
                self.store.add_event(pipeline_id, "pipeline_completed")
                self.store.settle(pipeline_id)
            return
        step = self.agents.steps_of(target)[index]
        try:
            inputs = self._inputs(step, value)
        except StepError as exc:
            self._fail(meta, {"kind": "PipelineStepError", "message": str(exc)[:2000], "step": step.name})
            return
        seq = from_seq + 1
        described = {
            "name": step.name,
            "kind": step.kind,
            "agent": step.agent,
            "pipeline": target,
            "index": index,
            "total": len(inputs),
            "via": via,
        }
        cap = step.concurrency if step.kind == "map" else 1
        if self.store.advance(pipeline_id, from_seq, target, index, step.kind, cap, described, inputs):
            self.store.add_event(pipeline_id, "step_started", seq=seq, step=step.name, items=len(inputs))
            if not inputs:  # a map over nothing is done at once
                self.advance(pipeline_id, seq)
                return
        self.pump(pipeline_id, seq)

    def _value(self, meta: PipelineMeta) -> Any:
        """The value the step after ``meta.seq`` gets."""
        if meta.seq < 0:
            input_type = self.agents.pipeline(meta.name).input_type
            if input_type is str:
                return meta.input
            try:
                return input_type.model_validate_json(meta.input)
            except Exception as exc:
                raise StepError(f"the input is not a {input_type.__name__}: {exc}") from None
        step = self._step(meta.target, meta.index)
        agent = self.agents.get(step.agent or "")
        results = self.store.results(meta.pipeline_id, meta.seq)
        values = [
            value_of(results[i], agent.output_type)
            for i in sorted(results)
            if results[i]["status"] == "completed"
        ]
        if step.kind == "map":
            return values
        if not values:
            raise StepError(f"step {step.name!r} has no completed run to hand on")
        return values[0]

    def _next(self, meta: PipelineMeta, value: Any) -> tuple[str | None, int, list[dict[str, str]]]:
        """The next step's place (pipeline, index), after any branches; (None, ...) at the end."""
        target, index = meta.target, meta.index + 1
        via: list[dict[str, str]] = []
        while True:
            steps = self.agents.steps_of(target)
            if index >= len(steps):
                return None, 0, via
            step = steps[index]
            if step.kind != "branch":
                return target, index, via
            assert step.choose is not None
            try:
                case = step.choose(value)
            except Exception as exc:
                raise StepError(
                    f"branch {step.name!r}: choose() raised {type(exc).__name__}: {exc}"
                ) from None
            if case not in step.cases:
                raise StepError(
                    f"branch {step.name!r}: choose() gave {str(case)[:100]!r}, not one of its cases"
                    f" ({', '.join(sorted(step.cases))})"
                )
            via.append({"branch": step.name, "case": case, "to": step.cases[case]})
            self.store.add_event(meta.pipeline_id, "branch_taken", branch=step.name, case=case)
            target, index = step.cases[case], 0

    def _inputs(self, step: Step, value: Any) -> list[str]:
        """The input text of each of the step's child runs."""
        try:
            if step.kind == "map":
                assert step.over is not None
                items = step.over(value)
                if not isinstance(items, list | tuple):
                    raise StepError(f"over() gave {type(items).__name__}, not a list")
                if len(items) > MAX_ITEMS:
                    raise StepError(f"over() gave {len(items)} items, more than {MAX_ITEMS}")
            else:
                items = [value]
            texts = [step.input(item) if step.input is not None else as_input(item) for item in items]
        except StepError as exc:
            raise StepError(f"step {step.name!r}: {exc}") from None
        except Exception as exc:
            raise StepError(
                f"step {step.name!r}: a mapping function raised {type(exc).__name__}: {exc}"
            ) from None
        for text in texts:
            if not isinstance(text, str):
                raise StepError(f"step {step.name!r}: input() gave {type(text).__name__}, not the input text")
        return texts

    def _state_before(self, pipeline_id: str, seq: int) -> dict[str, Any] | None:
        """The custom run state the run of step ``seq - 1`` ended with (one run: checked when the
        pipeline was registered); a run read from Redis or the archive alike."""
        completed = [
            r
            for _, r in sorted(self.store.results(pipeline_id, seq - 1).items())
            if r["status"] == "completed"
        ]
        head = self.runs.load(str(completed[0]["run_id"])) if completed else None
        return head.state if head is not None else None

    def _step(self, target: str, index: int) -> Step:
        return self.agents.steps_of(target)[index]

    def _step_of(self, pipeline_id: str, created_at: float, seq: int) -> Step | None:
        """The step the pipeline run took as step ``seq`` (None: not taken). A step taken never
        changes, so it is kept per pipeline run (its id and creation time: an id may be used again
        once its run expired) and read once per process, not for each child that ends."""
        key = (pipeline_id, created_at, seq)
        step = self._steps.get(key)
        if step is None:
            described = self.store.steps(pipeline_id).get(seq)
            if described is None:
                return None
            if len(self._steps) >= 256:
                self._steps.clear()
            step = self._steps[key] = self._step(described["pipeline"], int(described["index"]))
        return step

    # -- starting child runs -------------------------------------------------------------------

    def pump(self, pipeline_id: str, seq: int) -> int:
        """Start the step's items while its cap has room; returns how many runs were created. The
        children of a batch are created together, then noted together once all are (one script):
        a pump that dies before leaves them created and unnoted, which the child's record or the
        sweeper notes. (An end's record pumps under the step's lease: :meth:`_pump_leased`.)"""
        meta = self.store.meta(pipeline_id)
        if meta is None or meta.terminal or meta.seq != seq:
            return 0
        step = self._step(meta.target, meta.index)
        created = 0
        while True:
            batch = self.store.reserve(pipeline_id, seq, PUMP_BATCH)
            if not batch:
                return created
            made, to_note = self._create_children(meta, step, batch)
            created += made
            self._note_children(meta, step, to_note)
            if len(batch) < PUMP_BATCH:
                # The cap or the items ran out: room given back later comes with an item's
                # record, whose own pump takes it (and the sweeper's, should that pump die).
                return created

    def _pump_leased(
        self, meta: PipelineMeta, step: Step, batch: list[ItemToStart], lease: PumpLease
    ) -> None:
        """Start ``batch``, taken by a record with the step's pump ``lease``; then, in the script
        that notes them, take the room other ends gave back meanwhile (their records answered
        'pumping'), until none is left and the lease is given up. So ends close together share one
        pump: one take, create and note for all their items, not one each. After
        :data:`PUMP_ROUNDS` takes the lease is handed on to a live child's record."""
        rounds = 0
        while batch:
            rounds += 1
            _, to_note = self._create_children(meta, step, batch)
            batch = self._note_children(meta, step, to_note, lease, hand_on=rounds >= PUMP_ROUNDS)

    def start_item(
        self, meta: PipelineMeta, step: Step, item: int, attempt: int, text: str | None = None
    ) -> int:
        """Create the item's child run for ``attempt`` unless it exists, and note it; 1 if this
        call created it. ``text``: the item's input, when the caller read it already."""
        made, to_note = self._create_children(meta, step, [(item, attempt, text)])
        self._note_children(meta, step, to_note)
        return made

    def _create_children(
        self, meta: PipelineMeta, step: Step, items: Sequence[tuple[int, int, str | None]]
    ) -> tuple[int, list[tuple[int, str]]]:
        """Create the child run of each (item, attempt, input text or None: read it) unless it
        exists, all in one ``submit_many``: (how many this call created, the (item, run id) to
        note). An item has none to note when Redis is full for now, or its tenant is at its limits
        (it stays taken, and the sweeper creates it once there is room), or when it failed instead."""
        reservations = self._admit(meta, len(items))
        if reservations is not None:
            items = items[: len(reservations)]
        try:
            return self._create_admitted(meta, step, items)
        finally:
            for reservation in reservations or ():
                self.admissions.release(reservation)

    def _admit(self, meta: PipelineMeta, n: int) -> list[Reservation] | None:
        """Places under the tenant's limits (runs in flight, submits per minute) for up to ``n``
        children, as many as there is room for (None: a run without a tenant, which has none).
        Each place is held until its child is created, so concurrent pumps never pass the limit
        together (``producer/admission.py``)."""
        if meta.tenant is None:
            return None
        limits = self.tenants.limits(meta.tenant)
        taken: list[Reservation] = []
        try:
            while len(taken) < n:
                # Without waiting: once the room is taken, the places that fill it are this
                # pump's own, which no wait would see given back.
                taken.append(self.admissions.reserve(meta.tenant, limits, wait=False))
        except TenantLimited as exc:
            log.info(
                "pipeline %s: %d child runs wait for room under tenant %s's limits (%s)",
                meta.pipeline_id,
                n - len(taken),
                meta.tenant,
                exc.kind,
            )
        return taken

    def _create_admitted(
        self, meta: PipelineMeta, step: Step, items: Sequence[tuple[int, int, str | None]]
    ) -> tuple[int, list[tuple[int, str]]]:
        pipeline_id, seq = meta.pipeline_id, meta.seq
        state = self._state_before(pipeline_id, seq) if step.state else None
        requests = [
            RunRequest(
                step.agent or "",
                text if text is not None else self.store.item_input(pipeline_id, seq, item) or "",
                run_id=child_run_id(pipeline_id, seq, item, attempt),
                callback=CHILD_CALLBACK,
                link=PipelineLink(pipeline_id=pipeline_id, seq=seq, item=item, attempt=attempt),
                tenant=meta.tenant,
                state=state,
                namespace=meta.namespace,
            )
            for item, attempt, text in items
        ]
        outcomes = self.client.submit_many(requests, check_agent=False)
        created, to_note = 0, []
        for (item, attempt, _), request, outcome in zip(items, requests, outcomes, strict=True):
            run_id = request.run_id or ""
            if outcome is True:
                created += 1
                to_note.append((item, run_id))
            elif isinstance(outcome, StoreFull):
                log.warning("pipeline %s: child run %s not created yet: %s", pipeline_id, run_id, outcome)
            elif self._taken_by_child(meta, step, item, attempt, run_id, outcome):
                # Created before, by a creator that died or is at it right now: noted all the same.
                to_note.append((item, run_id))
        return created, to_note

    def _taken_by_child(
        self,
        meta: PipelineMeta,
        step: Step,
        item: int,
        attempt: int,
        run_id: str,
        refused: bool | WesichainError,
    ) -> bool:
        """Whether the child run id that was not created is this item's child, created before;
        if not, the item fails, once: it cannot run at all (``refused``: why, e.g. its input is too
        long), or its id was taken by a run this pipeline did not create."""
        existing = self.runs.load(run_id)
        if existing is None:
            if not isinstance(refused, InvalidRequest):  # its id was taken, by a run gone since
                refused = InvalidRequest(f"run id {run_id!r} already exists")
            error = refused.info().model_dump(mode="json")
            self._ended(meta.pipeline_id, step, meta.seq, item, attempt, run_id, "failed", None, error, False)
            return False
        if not self._is_child(existing, meta):
            # Its id was taken by a run this pipeline did not create: never adopt it.
            error = {
                "kind": "RunIdTaken",
                "message": f"the child run id {run_id} is taken by a run this pipeline did not start",
            }
            self._ended(meta.pipeline_id, step, meta.seq, item, attempt, run_id, "failed", None, error, False)
            return False
        return True

    def _note_children(
        self,
        meta: PipelineMeta,
        step: Step,
        children: list[tuple[int, str]],
        lease: PumpLease | None = None,
        hand_on: bool = False,
    ) -> list[ItemToStart]:
        """Note (and announce) created child runs of the current step (item, run id), once whoever
        notes them: their creator may have died right after creating them. For the holder of the
        step's pump ``lease``: the items it takes next (none: it gave the lease up)."""
        if not children and lease is None:
            return []
        seq = meta.seq
        started = [(item, run_id, _started_event(seq, step, item, run_id)) for item, run_id in children]
        _, running, batch = self.store.mark_children(
            meta.pipeline_id, seq, started, lease, PUMP_BATCH, hand_on
        )
        if not running:
            # Ended (cancelled, or failed) while these children were being created: its cascade
            # may have looked before they existed.
            for _, run_id in children:
                self.client.handle(run_id).cancel()
        return batch

    # -- learning that a child ended -----------------------------------------------------------

    def child_ended(self, ended: dict[str, Any]) -> None:
        """A child run ended (its completion callback, or the sweeper for a lost one).

        Only the run's id is taken from ``ended``: the pipeline, step, item and attempt are read
        from the stored run's link, which only this pool sets when it creates the run, and how the
        run ended is read from the stored run too. A run that is not one of this pipeline's
        children (no link, another tenant's, or an id that is not the link's child id) is ignored.
        """
        run_id = str(ended.get("run_id", ""))
        head = self.runs.load(run_id) if run_id else None
        if head is None:
            log.warning("run %s is not an ended pipeline child run; ignored", run_id[:200])
            return
        self.child_run_ended(head)

    def child_run_ended(self, head: RunHead) -> None:
        """The child run ``head`` ended, as read from the store (by :meth:`child_ended`, or by the
        claim of the callback delivered in place).

        A completed child of a pipeline run this process read before at the child's step is
        checked against the tenant it read then, without reading the meta again; every child's
        record (``pipe_record.lua``) carries the creation time read, and answers 'unknown' unless
        the id still names the pipeline run of that creation time: the child is then taken again
        from a fresh read. Any other end reads the meta first, as its retry or failure acts on the
        pipeline run at once."""
        run_id = head.run_id
        link = head.link
        if not isinstance(link, PipelineLink) or not head.terminal:
            log.warning("run %s is not an ended pipeline child run; ignored", run_id[:200])
            return
        meta = self._known.get(link.pipeline_id) if head.phase is Phase.COMPLETED else None
        if meta is None or meta.seq != link.seq:
            meta = self.store.meta(link.pipeline_id)
            if meta is None or not self._is_child(head, meta):
                log.warning("run %s is not a child of pipeline run %s; ignored", run_id, link.pipeline_id)
                return
            if len(self._known) >= 256:
                self._known.clear()
            self._known[link.pipeline_id] = meta
        elif not self._is_child(head, meta):
            self._known.pop(link.pipeline_id, None)  # maybe another run under that id now
            self.child_run_ended(head)
            return
        step = self._step_of(link.pipeline_id, meta.created_at, link.seq)
        if step is None:
            return
        answer = (head.answer, head.output) if head.phase is Phase.COMPLETED else None
        error = head.error.model_dump(mode="json") if head.error is not None else None
        recorded = self._ended(
            link.pipeline_id,
            step,
            link.seq,
            link.item,
            link.attempt,
            run_id,
            head.status,
            answer,
            error,
            True,
            known=meta,
        )
        if recorded == "unknown":
            self._known.pop(link.pipeline_id, None)
            self.child_run_ended(head)  # reads the meta: the pipeline run under that id, if any

    @staticmethod
    def _is_child(head: RunHead, meta: PipelineMeta) -> bool:
        """Whether ``head`` is a child run this pipeline run created: its runtime-set link names
        the pipeline, its id is the link's child id, and it belongs to the pipeline's tenant."""
        link = head.link
        return (
            isinstance(link, PipelineLink)
            and link.pipeline_id == meta.pipeline_id
            and head.run_id == child_run_id(link.pipeline_id, link.seq, link.item, link.attempt)
            and head.tenant == meta.tenant
        )

    def _ended(
        self,
        pipeline_id: str,
        step: Step,
        seq: int,
        item: int,
        attempt: int,
        run_id: str,
        status: str,
        answer: tuple[Any, Any] | None,
        error: dict[str, Any] | None,
        retryable: bool,
        known: PipelineMeta | None = None,
    ) -> str | None:
        """Record how the item ended (or retry it), and move on; returns the record's answer
        (None: retried). ``known``: the pipeline run as read at the item's step, maybe a while
        ago; the record then checks that the id still names it (else 'unknown', nothing done),
        and the pump that follows starts from it rather than reading the meta again.

        A record that leaves items waiting takes, in its own script, the step's pump lease and
        the items the cap has room for, and starts them (:meth:`_pump_leased`); when another holds
        the lease ('pumping'), that one takes the room this end gave back."""
        result: dict[str, Any] = {"run_id": run_id}
        if status == "completed" and answer is not None:
            result.update(status="completed", answer=answer[0], output=answer[1])
        else:
            error = error or {"kind": "Interrupted", "message": f"the child run ended {status}"}
            if retryable and attempt < step.retries and self.store.retry(pipeline_id, seq, item, attempt):
                self.store.add_event(
                    pipeline_id,
                    "child_retried",
                    seq=seq,
                    step=step.name,
                    item=item,
                    run_id=run_id,
                    error=error,
                )
                meta = self.store.meta(pipeline_id)
                if meta is not None and not meta.terminal:
                    self.start_item(meta, step, item, attempt + 1)
                return None
            result.update(status="skipped" if step.on_error == "skip" else "failed", error=error)
        ended = {
            "kind": "child_ended",
            "seq": seq,
            "step": step.name,
            "item": item,
            "run_id": run_id,
            "status": result["status"],
        }
        # A child run of this pipeline ended (``retryable``): noted with its record if its creator
        # died before noting it.
        started = _started_event(seq, step, item, run_id) if retryable else None
        created_at = known.created_at if known is not None else None
        # A failure ends the pipeline run: nothing more to start.
        lease = PumpLease(os.urandom(8).hex(), PUMP_LEASE_MS) if result["status"] != "failed" else None
        recorded, batch = self.store.record(
            pipeline_id, seq, item, attempt, result, ended, started, created_at, PUMP_BATCH, lease
        )
        if recorded not in ("recorded", "waiting", "complete"):
            return recorded
        if result["status"] == "failed":
            meta = self.store.meta(pipeline_id)
            if meta is not None:
                child_error = error or {}
                self._fail(
                    meta,
                    {
                        "kind": str(child_error.get("kind", "ChildFailed")),
                        "message": f"step {step.name!r}, item {item}: {child_error.get('message', '')}"[
                            :2000
                        ],
                        "step": step.name,
                        "seq": seq,
                        "item": item,
                        "run_id": run_id,
                        "child_error": child_error,
                    },
                )
            return recorded
        if recorded == "complete":
            self.advance(pipeline_id, seq)
        elif recorded == "recorded" and batch and lease is not None:
            # The pipeline run as read at step ``seq`` (its id, tenant, namespace and step never
            # change), which the record just found to be still that run; its counts and status
            # may be old: the scripts take items only while it is running at that step.
            meta = known if known is not None and known.seq == seq else self.store.meta(pipeline_id)
            if meta is not None and not meta.terminal and meta.seq == seq:
                self._pump_leased(meta, step, batch, lease)
            # Else it ended or moved on meanwhile: the items taken are never started, and the
            # lease lapses.
        return recorded

    # -- ending ------------------------------------------------------------------------------

    def _fail(self, meta: PipelineMeta, error: dict[str, Any]) -> None:
        if self.store.end(meta.pipeline_id, meta.seq, "failed", error=error) == "ok":
            log.info("pipeline %s failed: %s", meta.pipeline_id, error.get("message"))
            self.store.add_event(meta.pipeline_id, "pipeline_failed", error=error)
        self.cascade(meta.pipeline_id)

    def cascade(self, pipeline_id: str) -> None:
        """Cancel the live children of an ended pipeline run, then let the sweeper forget it."""
        self.store.cancel_children(pipeline_id, lambda run_id: self.client.handle(run_id).cancel())

    # -- the sweeper's repairs -----------------------------------------------------------------

    def tick(self) -> int:
        """Repair every active pipeline run once; returns the repairs made."""
        repaired = 0
        self.store.trim_index()
        for pipeline_id in self.store.active():
            try:
                repaired += self._repair(pipeline_id)
            except Exception:  # one broken pipeline run must not stop the others' repairs
                log.exception("pipeline %s: repair failed", pipeline_id)
        return repaired

    def _tenant_full(self, meta: PipelineMeta) -> bool:
        """Whether the pipeline run's tenant has no room for another run in flight now."""
        if meta.tenant is None:
            return False
        return self.runs.inflight(meta.tenant) >= self.tenants.limits(meta.tenant).max_inflight

    def _repair(self, pipeline_id: str) -> int:
        meta = self.store.meta(pipeline_id)
        if meta is None:
            self.store.settle(pipeline_id)
            return 0
        if meta.terminal:
            self.cascade(pipeline_id)
            return 1
        now = time.time()
        if meta.seq < 0:
            if now - meta.updated_ms / 1000 > self.grace_s:
                self.advance(pipeline_id, -1)  # the submitter's advance was lost
                return 1
            return 0
        if meta.done == meta.total:
            self.advance(pipeline_id, meta.seq)
            return 1
        step = self._step(meta.target, meta.index)
        # Items waiting for room under the tenant's limits wait, taken, for a later pass (each would
        # only be refused); the rest of the repairs go on.
        full = self._tenant_full(meta)
        results = self.store.results(pipeline_id, meta.seq)
        children = self.store.children(pipeline_id, meta.seq)
        attempts = self.store.attempts(pipeline_id, meta.seq)
        repaired = 0
        for item in range(meta.started):
            if item in results:
                continue
            attempt = attempts.get(item, 0)
            run_id = child_run_id(pipeline_id, meta.seq, item, attempt)
            head = self.runs.load(run_id)
            if head is None and children.get(item) == run_id:
                error = {"kind": "RunLost", "message": "the child run expired before its end was recorded"}
                self._ended(pipeline_id, step, meta.seq, item, attempt, run_id, "failed", None, error, True)
                repaired += 1
            elif children.get(item) != run_id:
                if full:
                    continue
                # Never created, or created and not noted: its creator died (or is at it right now;
                # creating and noting are both once-only).
                log.warning("pipeline %s: child run %s was left unstarted; starting it", pipeline_id, run_id)
                self.start_item(meta, step, item, attempt)
                repaired += 1
            elif head is not None and head.terminal and now - head.updated_at > self.grace_s:
                log.warning("pipeline %s: child run %s ended untold; recording it", pipeline_id, run_id)
                self.child_ended({"run_id": run_id})
                repaired += 1
        if meta.started < meta.total and meta.started - meta.done < meta.cap and not full:
            repaired += int(self.pump(pipeline_id, meta.seq) > 0)
        return repaired


def _started_event(seq: int, step: Step, item: int, run_id: str) -> dict[str, Any]:
    """The ``child_started`` event of an item's child run."""
    return {"kind": "child_started", "seq": seq, "step": step.name, "item": item, "run_id": run_id}
