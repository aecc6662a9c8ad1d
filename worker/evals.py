"""The pool drives evals: start case runs within the cap, score each run that ended, recover.

* ``wesichain.eval.pump`` starts case runs while the eval's cap has room (each its own run, with a
  deterministic id and a Celery completion callback);
* ``wesichain.eval.score`` is that callback: it scores the ended run, records the result once,
  gives the slot back and starts the next case runs;
* the sweeper's :meth:`EvalPool.tick` repairs what a dead process left: a slot whose run was never
  created (its creator died), a run that ended but was never scored (the scoring task was lost
  with its worker), an eval with room and nothing pumping.

Nothing here depends on the process that submitted the eval.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

from celery import Celery

from producer.client import Client, RunRequest
from producer.publishing import RuntimePublisher
from shared.agents import AgentRegistry
from shared.errors import InvalidRequest, ModelTransport, StoreFull
from shared.evals.dataset import Case
from shared.evals.errors import EvalNotFound
from shared.evals.outcome import CaseResult, RunOutcome, trajectory
from shared.evals.scorers import JudgeReply
from shared.evals.scoring import result_of, run_outcome
from shared.evals.store import EvalMeta, EvalStore, Item, Recorded, run_id_of
from shared.evals.tasks import TASK_EVAL_SCORE, pump_task
from shared.limits import Throttled
from shared.llm.base import ModelRequest
from shared.llm.resolver import resolve_model
from shared.messages import SystemMessage, UserMessage
from shared.state import Callback, EvalLink, RunHead, TaskSpec
from shared.webhooks import outcome
from worker.metrics import Metrics
from worker.runtime import Runtime
from worker.throttle import DEFAULT_BACK_OFF_S, LimitedAdapter, ModelGate

__all__ = ["PUMP_BATCH", "EvalPool"]

log = logging.getLogger("wesichain.evals")

#: Case runs one pump takes at a time (it loops until the cap or the work runs out).
PUMP_BATCH = 50


class EvalPool:
    """What the pool does for evals, on the run store's Redis; ``client`` creates the case runs."""

    @classmethod
    def for_runtime(cls, rt: Runtime) -> EvalPool:
        # The client only submits (Client.submit sends the start by name): publishing through the
        # runtime is what the worker's own phases do, without a second broker connection.
        client = Client(rt.settings, app=cast(Celery, RuntimePublisher(rt.send, rt.send_all)), store=rt.store)
        return cls(client, rt.send, rt.agents, rt.gate, rt.metrics)

    def __init__(
        self,
        client: Client,
        send: Callable[[TaskSpec], None],
        agents: AgentRegistry,
        gate: ModelGate | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.client = client
        self.send = send
        #: Where ``scripted:NAME`` judges are found (other models go to their provider).
        self.agents = agents
        #: The pool's provider limits, which a judge's calls take like a think's (None: no limits).
        self.gate = gate
        self.metrics = metrics
        self.runs = client.store
        self.evals = EvalStore(client.store.redis, client.store.keys, client.settings.retention_s)
        settings = client.settings
        #: How long a pump may take to create a run after taking its slot, and a scorer to score.
        self.lease_s = max(10.0, settings.lease_s * 3)
        #: How long an ended run may wait for its scoring callback before the sweeper scores it.
        self.grace_s = max(5.0, settings.lease_s * 2)
        #: How often the sweeper looks at a running case run (to find one that ended unscored).
        self.recheck_s = max(10.0, self.grace_s)
        #: Specs by eval id: a spec never changes once the eval exists (its status is read fresh).
        self._specs: dict[str, EvalMeta] = {}

    def _meta(self, eval_id: str) -> EvalMeta:
        meta = self._specs.get(eval_id)
        if meta is None:
            if len(self._specs) >= 64:
                self._specs.clear()
            meta = self._specs[eval_id] = self.evals.meta(eval_id)
        return meta

    # -- starting case runs ----------------------------------------------------------------------

    def pump(self, eval_id: str) -> int:
        """Start case runs until the cap, the budget or the work runs out; returns how many."""
        try:
            meta = self._meta(eval_id)
        except EvalNotFound:
            return 0
        started = 0
        while True:
            got = self.evals.acquire(eval_id, meta.spec, PUMP_BATCH, self.lease_s)
            if got.status != "ok":
                return started
            started += self.start_many(meta, got.items)

    def start(self, meta: EvalMeta, item: Item) -> int:
        """Create the item's case run unless it exists, then hold its slot; 1 if it was created."""
        return self.start_many(meta, [item])

    def start_many(self, meta: EvalMeta, items: list[Item]) -> int:
        """Create the items' case runs unless they exist (their cases read in one round trip, the
        runs created in one ``submit_many``), then hold the slots of those that exist (one
        command); returns how many runs were created."""
        eval_id, spec = meta.eval_id, meta.spec
        cases = self.evals.cases_of(eval_id, [item.case for item in items])
        requests = []
        for item, case in zip(items, cases, strict=True):
            variant = spec.variants[item.variant]
            run_id = run_id_of(eval_id, item)
            requests.append(
                RunRequest(
                    variant.agent,
                    case.input,
                    run_id=run_id,
                    model=variant.model,
                    thread_id=f"{run_id}:{case.thread}" if case.thread else None,
                    metadata={**variant.metadata, **case.metadata} or None,
                    # Scored in place by the worker that ended the run (on the namespace's queues,
                    # if the eval names one), unless the spec sends scorings to a queue of their own.
                    callback=Callback(task=TASK_EVAL_SCORE, queue=spec.queue),
                    link=EvalLink(eval_id=eval_id, item=str(item)),
                    namespace=spec.namespace,
                    # A tenant's eval runs as that tenant: its case runs open in its console.
                    tenant=meta.tenant,
                )
            )
        outcomes = self.client.submit_many(requests, check_agent=False)
        bound: list[Item] = []
        for item, case, request, outcome_ in zip(items, cases, requests, outcomes, strict=True):
            if isinstance(outcome_, StoreFull):
                # Leave the slot leased: the sweeper tries again once its lease ran out.
                log.warning("eval %s: case run %s not created yet: %s", eval_id, request.run_id, outcome_)
            elif outcome_ is True or self.runs.load(request.run_id or "") is not None:
                bound.append(item)
            else:
                # The case itself cannot run (e.g. its input is too long): record why, once.
                refused = outcome_ if isinstance(outcome_, InvalidRequest) else None
                self._record_unrunnable(meta, item, case, request.run_id or "", refused)
        # The items' runs exist: their slots are held until their results are recorded.
        self.evals.checked(eval_id, bound, time.time() * 1000)
        return sum(1 for outcome_ in outcomes if outcome_ is True)

    def _record_unrunnable(
        self, meta: EvalMeta, item: Item, case: Case, run_id: str, refused: InvalidRequest | None
    ) -> None:
        if refused is None:  # its id was taken, by a run gone since
            refused = InvalidRequest(f"run id {run_id!r} already exists")
        ended = RunOutcome(run_id=run_id, status="failed", error=refused.info().model_dump(mode="json"))
        self.evals.record(meta.eval_id, item, result_of(meta.spec, item, case, ended, ""))

    # -- scoring ended runs ----------------------------------------------------------------------

    def score(self, ended: dict[str, Any]) -> CaseResult | None:
        """Score one ended case run (its completion callback); None if another scorer has it.

        Only the run's id is taken from ``ended``: the eval and case are read from the stored
        run's link, which only this pool sets when it creates the run, and what is scored is the
        stored run's end. A run that is not this eval's case run is ignored.
        """
        run_id = str(ended.get("run_id", ""))
        head = self.runs.load(run_id) if run_id else None
        if head is None:
            log.warning("run %s is not an ended eval case run; ignored", run_id[:200])
            return None
        return self.score_run(head)

    def score_run(self, head: RunHead) -> CaseResult | None:
        """Score the ended case run ``head``, as read from the store (by :meth:`score`, or by the
        claim of the callback delivered in place); None if another scorer has it or it is not one
        of this pool's case runs."""
        run_id = head.run_id
        link = head.link
        if not isinstance(link, EvalLink) or not head.terminal:
            log.warning("run %s is not an ended eval case run; ignored", run_id[:200])
            return None
        eval_id = link.eval_id
        try:
            item = Item.parse(link.item)
        except ValueError:
            return None
        try:
            meta = self._meta(eval_id)
        except EvalNotFound:
            return None
        if run_id != run_id_of(eval_id, item) or head.tenant != meta.tenant:
            # Case runs have the deterministic id of their item, and the eval's tenant (none: the
            # operator's eval): anything else is not a run this pool created.
            log.warning("run %s is not the case run of eval %s item %s; ignored", run_id, eval_id, item)
            return None
        _, case = self.evals.claim_scoring(eval_id, item, self.lease_s)
        if case is None:
            return None  # scored already, or being scored
        ended = outcome(head)
        steps = trajectory(self.runs.load_messages(run_id))
        outcome_ = run_outcome(ended, steps)
        try:
            result = result_of(meta.spec, item, case, outcome_, head.model, self.judge)
        except Throttled as throttled:
            self._score_later(meta, item, ended, throttled)
            return None
        if self.evals.record(eval_id, item, result) is Recorded.ITEMS_PENDING:
            self.pump(eval_id)
        return result

    def _score_later(self, meta: EvalMeta, item: Item, ended: dict[str, Any], throttled: Throttled) -> None:
        """A judge got no capacity: give the scoring back and send it again after its countdown,
        as a think waiting for capacity is (no worker thread sleeps on a slot). Should the task be
        lost, the sweeper scores the ended run after its grace, as it does any unscored run."""
        wait = throttled.countdown()
        self.evals.defer_scoring(meta.eval_id, item)
        if self.metrics is not None:
            judge_model = throttled.scope.partition("@")[0]
            self.metrics.model_throttled(judge_model, throttled.reason)
        log.info(
            "eval %s: judging %s throttled (%s on %s); again in %.2fs",
            meta.eval_id,
            item,
            throttled.reason,
            throttled.scope,
            wait,
        )
        self.send(
            TaskSpec(
                name=TASK_EVAL_SCORE,
                task_id=f"{ended['run_id']}:score:{uuid.uuid4().hex[:8]}",
                arguments={},
                args=[ended],
                queue=meta.spec.task_queue,
                countdown=wait,
            )
        )

    def judge(self, model: str, system: str, prompt: str, tenant: str | None = None) -> JudgeReply:
        """Ask a judge model, through the same adapters (retries, timeouts) as a think phase and
        within the same provider limit (scope ``provider:model[@tenant]``); raises
        :class:`Throttled` when the limit has no capacity now or the provider answered 429."""
        adapter = resolve_model(model, self.agents)
        request = ModelRequest(
            model=model.partition(":")[2],
            messages=[SystemMessage(content=system), UserMessage(content=prompt)],
            temperature=0.0,
            max_tokens=400,
        )
        gate = self.gate
        limit = gate.limit_for_model(model, tenant) if gate is not None else None
        if gate is not None and limit is not None:
            adapter = LimitedAdapter(adapter, gate, gate.admit(limit, request))
        try:
            response = adapter.complete(request)
        except ModelTransport as exc:
            if limit is not None and exc.status_code == 429:
                # LimitedAdapter made the whole pool back off; this scoring waits it out queued.
                raise Throttled(limit.scope, "retry_after", exc.retry_after_s or DEFAULT_BACK_OFF_S) from exc
            raise
        usage = response.usage
        return JudgeReply(response.text or "", usage.input_tokens, usage.output_tokens)

    # -- the sweeper's repairs -------------------------------------------------------------------

    def tick(self) -> int:
        """Repair every active eval once; returns the repairs made."""
        repaired = 0
        self.evals.trim_index()
        for eval_id in self.evals.active():
            try:
                repaired += self._repair(self.evals.meta(eval_id))
            except EvalNotFound:
                continue
        return repaired

    def _repair(self, meta: EvalMeta) -> int:
        eval_id = meta.eval_id
        now_ms = self.evals.now_ms()
        repaired = 0
        for item in self.evals.expired(eval_id, now_ms):
            log.warning("eval %s: the creator of case run %s died; creating it", eval_id, item)
            self.start(meta, item)
            repaired += 1
        # Each running case run is looked at once per recheck interval, not at every sweep.
        due = self.evals.unchecked(eval_id, time.time() * 1000 - self.recheck_s * 1000)
        for item in due:
            repaired += self._check_run(meta, item, now_ms)
        self.evals.checked(eval_id, due, time.time() * 1000)
        if (
            meta.status == "running"
            and self.evals.in_flight(eval_id) < meta.spec.concurrency
            and self.evals.pending(eval_id) > 0
        ):
            self.send(pump_task(eval_id, meta.spec.task_queue))
            repaired += 1
        return repaired

    def _check_run(self, meta: EvalMeta, item: Item, now_ms: float) -> int:
        """A held slot: is its run still going, or did it end without being scored?"""
        run_id = run_id_of(meta.eval_id, item)
        head: RunHead | None = self.runs.load(run_id)
        if head is None:
            ended = RunOutcome(
                run_id=run_id,
                status="failed",
                error={"kind": "RunLost", "message": "the case run expired before it was scored"},
            )
            case = self.evals.case(meta.eval_id, item.case)
            recorded = self.evals.record(meta.eval_id, item, result_of(meta.spec, item, case, ended, ""))
            return int(recorded is not Recorded.DUPLICATE)
        if not head.terminal or now_ms / 1000 - head.updated_at < self.grace_s:
            return 0
        log.warning("eval %s: case run %s ended unscored; scoring it", meta.eval_id, run_id)
        self.send(
            TaskSpec(
                name=TASK_EVAL_SCORE,
                task_id=f"{run_id}:score:{uuid.uuid4().hex[:8]}",
                arguments={},
                args=[outcome(head)],
                queue=meta.spec.task_queue,
            )
        )
        return 1
