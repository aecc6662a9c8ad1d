"""Submit an eval and follow it; the pool does the rest (see ``worker/evals.py``).

evals = EvalClient(Client.from_env())
eval_id, created = evals.submit_file("examples/research-eval.toml")
evals.wait(eval_id, timeout=3600)
rows = evals.results(eval_id)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producer.client import Client
from shared.errors import InvalidRequest
from shared.evals.annotations import Annotation, AnnotationInput, AnnotationStore, check_item
from shared.evals.context import eval_context
from shared.evals.dataset import Case, load_dataset
from shared.evals.errors import EvalSpecError
from shared.evals.outcome import CaseResult
from shared.evals.scorers import check_importable
from shared.evals.spec import EvalSpec, load_spec
from shared.evals.store import STOPPED, EvalMeta, EvalStore, Item, VariantCounts
from shared.evals.tasks import pump_task
from shared.request import check_name, validate_request
from shared.state import TaskSpec

__all__ = ["EvalClient", "EvalTimeout", "Progress"]


class EvalTimeout(TimeoutError):
    """``EvalClient.wait`` ran out of time; the eval goes on."""


@dataclass(frozen=True)
class Progress:
    """Where an eval stands."""

    meta: EvalMeta
    counts: list[VariantCounts]
    in_flight: int
    pending: int
    recorded: int
    #: Scorings that waited for their judge's provider capacity (each sent again later).
    judge_waits: int = 0

    @property
    def done(self) -> bool:
        return self.meta.status == "completed"

    @property
    def drained(self) -> bool:
        """Nothing runs any more: completed, or stopped with no case run in flight."""
        return self.done or (self.meta.status in STOPPED and self.in_flight == 0)


class EvalClient:
    """Evals on the same Redis (and broker) as ``client``."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.store = EvalStore(
            client.store.redis, client.store.keys, client.settings.retention_s, archive=client.store.archive
        )
        self.annotations = AnnotationStore(
            client.store.redis, client.store.keys, client.settings.retention_s, archive=client.store.archive
        )

    def submit_file(
        self,
        path: str | Path,
        *,
        eval_id: str | None = None,
        model: str | None = None,
        check_agents: bool = True,
        namespace: str | None = None,
        tenant: str | None = None,
    ) -> tuple[str, bool]:
        spec, base = load_spec(path)
        if model is not None:
            spec = spec.with_model(model)
        if namespace is not None:
            spec = spec.with_namespace(namespace)
        dataset_path = (base / spec.dataset).resolve()
        cases, data = load_dataset(dataset_path)
        spec_path = Path(path)
        context = eval_context(
            spec_path.read_bytes(), spec_path.name, data, self.client.settings.agents_module
        )
        return self.submit(
            spec,
            cases,
            data,
            dataset_path.name,
            eval_id=eval_id,
            check_agents=check_agents,
            tenant=tenant,
            context=context,
        )

    def submit(
        self,
        spec: EvalSpec,
        cases: list[Case],
        dataset_bytes: bytes,
        dataset_name: str,
        *,
        eval_id: str | None = None,
        check_agents: bool = True,
        tenant: str | None = None,
        context: dict[str, Any] | None = None,
    ) -> tuple[str, bool]:
        """Create the eval (unless it exists) and start it on the pool; returns (id, created).

        The id defaults to the spec's name and a digest of the spec and dataset: submitting the
        same eval again attaches to it, never runs its cases twice. ``tenant`` owns the eval: only
        its API keys see and annotate it in the HTTP API (None: the operator's, as before).
        ``context`` (content hashes, code version) defaults to the dataset's hash and the agents'
        code version.
        """
        if tenant is not None:
            try:
                check_name("tenant", tenant)
            except InvalidRequest as exc:
                raise EvalSpecError(exc.message) from None
        if context is None:
            context = eval_context(None, None, dataset_bytes, self.client.settings.agents_module)
        check_importable(spec.scorers)
        limits = self.client.settings.limits
        for case in cases:
            try:
                validate_request({"agent": spec.variants[0].agent, "input": case.input}, limits)
            except InvalidRequest as exc:
                raise EvalSpecError(f"case {case.id!r}: {exc.message}") from None
        if check_agents:
            served = set(self.client.workers.agents())
            missing = sorted({v.agent for v in spec.variants} - served)
            if missing:
                raise InvalidRequest(
                    f"no live worker serves agent(s) {', '.join(missing)}; submit with --no-check to"
                    " queue the eval anyway"
                )
        eval_id = eval_id or f"{spec.name}-{spec.digest(dataset_bytes)}"
        try:
            check_name("eval id", eval_id)
        except InvalidRequest as exc:
            raise EvalSpecError(exc.message) from None
        if len(eval_id) > 120:
            raise EvalSpecError(f"eval id {eval_id[:40]!r}... is longer than 120 characters")
        if ":" in eval_id:
            # Its annotations' keys join the tenant and the id with ':', and tenant names may hold
            # ':': tenant org's eval eu:x and tenant org:eu's eval x would share them.
            raise EvalSpecError(
                f"eval id {eval_id[:80]!r} holds ':': name the eval (or give --id) without one"
            )
        try:
            created = self.store.create(eval_id, spec, cases, dataset_name, tenant=tenant, context=context)
        except ValueError as exc:
            raise EvalSpecError(str(exc)) from None
        if created or self.store.meta(eval_id).status == "running":
            self._send(pump_task(eval_id, spec.task_queue))
        return eval_id, created

    def progress(self, eval_id: str) -> Progress:
        meta = self.store.meta(eval_id)
        return Progress(
            meta=meta,
            counts=self.store.counts(eval_id, len(meta.spec.variants)),
            in_flight=self.store.in_flight(eval_id),
            pending=self.store.pending(eval_id),
            recorded=self.store.recorded(eval_id),
            judge_waits=self.store.judge_waits(eval_id),
        )

    def wait(self, eval_id: str, timeout: float, poll_s: float = 0.5) -> Progress:
        """Block until the eval completed (or stopped and drained)."""
        deadline = time.monotonic() + timeout
        while True:
            progress = self.progress(eval_id)
            if progress.drained:
                return progress
            if time.monotonic() >= deadline:
                raise EvalTimeout(f"eval {eval_id} still {progress.meta.status} after {timeout:g}s")
            time.sleep(poll_s)

    def cancel(self, eval_id: str) -> str:
        """Start no more case runs (those in flight finish and are scored); returns the prior status."""
        return self.store.set_status(eval_id, "cancelled", ("running",))

    def resume(self, eval_id: str) -> str:
        """Start case runs again after a cancel (or a raised budget); returns the prior status."""
        meta = self.store.meta(eval_id)
        was = self.store.set_status(eval_id, "running", STOPPED)
        if was in STOPPED or was == "running":
            self._send(pump_task(eval_id, meta.spec.task_queue))
        return was

    def results(self, eval_id: str) -> list[CaseResult]:
        """Every recorded result, by case, then variant, then repeat."""

        def order(r: CaseResult) -> tuple[int, int, int]:
            item = Item.parse(r.item)
            return item.case, item.variant, item.repeat

        return sorted(self.store.results(eval_id), key=order)

    def annotate(self, eval_id: str, item: str, value: AnnotationInput, by: str) -> Annotation:
        """Store a reviewer's annotation of one case run (``variant:case:repeat``) of the eval,
        in the eval's tenant; raises :class:`EvalNotFound` for an eval or case run it has not."""
        meta = self.store.meta(eval_id)
        check_item(meta, item)
        return self.annotations.put(meta.tenant, eval_id, item, value, by)

    def labels(self, eval_id: str) -> dict[str, Annotation]:
        """Item -> its latest annotation."""
        return self.annotations.latest(self.store.meta(eval_id).tenant, eval_id)

    def _send(self, task: TaskSpec) -> None:
        self.client.app.send_task(task.name, kwargs=task.arguments, task_id=task.task_id, queue=task.queue)
