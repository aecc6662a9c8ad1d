"""``/v1/evals``: a tenant's evals for the viewer (``/evals/``): the index with each variant's
figures, one eval's full view, its results as a file, a paired comparison of two evals, and the
reviewers' annotations.

An eval belongs to the tenant it was created for (``wesichain eval run --tenant``; none: the
operator's, seen with authentication off). Every handler answers 404 for another tenant's eval
exactly as for one that does not exist. A reviewer's identity is the caller's API key, never a
field of the body.
"""

from __future__ import annotations

from collections import defaultdict
from functools import cache
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel, Field

from producer.api.auth import Caller
from producer.api.console import page_headers
from producer.api.errors import ApiError
from producer.api.runs import ERRORS, Svc, Who
from producer.api.services import Services
from producer.evals.export import export
from producer.evals.report import comparison_data, index_entry, inline_assets, render_live, report_data
from shared.errors import InvalidRequest
from shared.evals.annotations import Annotation, AnnotationInput, AnnotationStore, agreement, check_item
from shared.evals.compare import compare
from shared.evals.errors import EvalNotFound
from shared.evals.outcome import CaseResult
from shared.evals.store import EvalMeta, EvalStore, Item
from shared.request import check_name

__all__ = [
    "MAX_COMPARED_PAIRS",
    "MAX_LISTED_EVALS",
    "AnnotationList",
    "EvalComparison",
    "EvalIndex",
    "annotate",
    "compare_evals",
    "eval_page",
    "eval_results",
    "get_eval",
    "index_page",
    "list_annotations",
    "list_evals",
    "pages",
    "router",
]

#: Evals one index answer lists, and per-case pairs one comparison answer lists.
MAX_LISTED_EVALS = 100
MAX_COMPARED_PAIRS = 5000

router = APIRouter(prefix="/v1", responses=ERRORS)
pages = APIRouter()


class EvalIndex(BaseModel):
    evals: list[dict[str, Any]] = Field(
        description="The caller's newest evals, newest first: id, name, status, created_at,"
        " finished_at, dataset, cases, code_version, verdict and each variant's figures."
    )


class AnnotationList(BaseModel):
    latest: list[Annotation] = Field(description="Each annotated case run's latest annotation (its label).")
    history: list[Annotation] = Field(description="Every annotation, oldest first (the newest 1000).")


class EvalComparison(BaseModel):
    comparisons: list[dict[str, Any]] = Field(
        description="Per variant: pairs, pass counts, regressions, improvements, McNemar's p."
    )
    cases: list[dict[str, Any]] = Field(
        description="Each paired case run: case_id, repeat, variant, baseline and candidate passed."
    )
    truncated: bool = Field(description="True when more pairs exist than are listed.")
    agreement: dict[str, Any] = Field(
        description="Human labels against automatic verdicts, of the baseline and the candidate."
    )


def _stores(services: Services) -> tuple[EvalStore, AnnotationStore]:
    store = services.store
    retention = services.config.settings.retention_s
    return (
        EvalStore(store.redis, store.keys, retention, archive=store.archive),
        AnnotationStore(store.redis, store.keys, retention, archive=store.archive),
    )


def _owned(evals: EvalStore, who: Caller, eval_id: str) -> EvalMeta:
    """The caller's eval; 404 if there is none (or it is another tenant's)."""
    try:
        check_name("eval_id", eval_id)
        meta = evals.meta(eval_id)
    except (InvalidRequest, EvalNotFound):
        raise ApiError(404, "not_found", f"no eval {eval_id[:120]!r}") from None
    if meta.tenant != who.tenant:
        raise ApiError(404, "not_found", f"no eval {eval_id[:120]!r}")
    return meta


def _results(evals: EvalStore, eval_id: str) -> list[CaseResult]:
    def order(r: CaseResult) -> tuple[int, int, int]:
        item = Item.parse(r.item)
        return item.case, item.variant, item.repeat

    return sorted(evals.results(eval_id), key=order)


@router.get(
    "/evals",
    response_model=EvalIndex,
    summary="List the caller's evals",
    description="The newest evals of the caller's tenant with each variant's pass rate, interval,"
    " mean scores, cost and latency: the viewer's index and its trend charts.",
)
def list_evals(
    services: Svc, who: Who, limit: Annotated[int, Query(ge=1, le=MAX_LISTED_EVALS)] = 50
) -> EvalIndex:
    evals, _ = _stores(services)
    entries = []
    # The tenant's own evals, in Redis and archived; a few more than the limit, for those that
    # expire between the listing and the read.
    for eval_id in evals.tenant_evals(who.tenant, limit + 10):
        try:
            meta = evals.meta(eval_id)
        except EvalNotFound:
            continue  # expired since it was listed
        if meta.tenant != who.tenant:
            continue
        entries.append(index_entry(meta, list(evals.results(eval_id))))
        if len(entries) >= limit:
            break
    return EvalIndex(evals=entries)


@router.get(
    "/evals/{eval_id}",
    summary="One eval, as the viewer shows it",
    description="Context (times, spec and dataset with sha256 hashes, variants, code version), the"
    " gate's verdict, per-variant summary, breakdown by dataset field, failures, comparisons"
    " between variants, agreement of human labels with the scorers, and every case with its runs"
    " and annotations.",
)
def get_eval(eval_id: str, services: Svc, who: Who) -> dict[str, Any]:
    evals, annotations = _stores(services)
    meta = _owned(evals, who, eval_id)
    return report_data(
        meta, evals.cases(eval_id), _results(evals, eval_id), annotations.latest(who.tenant, eval_id)
    )


@router.get(
    "/evals/{eval_id}/results",
    response_class=Response,
    responses={
        200: {
            "description": "The file.",
            "content": {"text/csv": {}, "application/x-ndjson": {}, "application/xml": {}},
        }
    },
    summary="An eval's results as a file",
    description="One row per case run (``jsonl``, ``csv`` or ``junit``), with the human label,"
    " score overrides, note, reviewer and time of each annotated case run beside its scores.",
)
def eval_results(
    eval_id: str,
    services: Svc,
    who: Who,
    format: Annotated[Literal["jsonl", "csv", "junit"], Query()] = "csv",
) -> Response:
    evals, annotations = _stores(services)
    _owned(evals, who, eval_id)
    text = export(_results(evals, eval_id), format, eval_id, annotations.latest(who.tenant, eval_id))
    media = {"jsonl": "application/x-ndjson", "csv": "text/csv", "junit": "application/xml"}[format]
    return Response(text, media_type=f"{media}; charset=utf-8")


@router.get(
    "/evals/{baseline}/compare/{candidate}",
    response_model=EvalComparison,
    summary="Two evals side by side",
    description="The paired test ``wesichain eval compare`` runs: case runs paired by (case,"
    " repeat) per variant name (or the only variant of each), McNemar's exact test, and each pair.",
)
def compare_evals(baseline: str, candidate: str, services: Svc, who: Who) -> EvalComparison:
    evals, annotations = _stores(services)
    _owned(evals, who, baseline)
    _owned(evals, who, candidate)
    base, cand = _results(evals, baseline), _results(evals, candidate)
    base_by: dict[str, list[CaseResult]] = defaultdict(list)
    cand_by: dict[str, list[CaseResult]] = defaultdict(list)
    for r in base:
        base_by[r.variant].append(r)
    for r in cand:
        cand_by[r.variant].append(r)
    pairs_of = [(n, n) for n in base_by if n in cand_by]
    if not pairs_of and len(base_by) == 1 and len(cand_by) == 1:
        pairs_of = [(next(iter(base_by)), next(iter(cand_by)))]
    comparisons = []
    cases: list[dict[str, Any]] = []
    total = 0
    for vb, vc in pairs_of:
        comparisons.append(
            comparison_data(compare(base_by[vb], cand_by[vc], f"{baseline}/{vb}", f"{candidate}/{vc}"))
        )
        was = {(r.case_id, r.repeat): r.passed for r in base_by[vb]}
        for r in cand_by[vc]:
            before = was.get((r.case_id, r.repeat))
            if before is None:
                continue
            total += 1
            if len(cases) < MAX_COMPARED_PAIRS:
                cases.append(
                    {
                        "case_id": r.case_id,
                        "repeat": r.repeat,
                        "variant": vc,
                        "baseline": before,
                        "candidate": r.passed,
                    }
                )
    return EvalComparison(
        comparisons=comparisons,
        cases=cases,
        truncated=total > len(cases),
        agreement={
            "baseline": agreement(base, annotations.latest(who.tenant, baseline)).as_dict(),
            "candidate": agreement(cand, annotations.latest(who.tenant, candidate)).as_dict(),
        },
    )


@router.get(
    "/evals/{eval_id}/annotations",
    response_model=AnnotationList,
    summary="An eval's annotations",
    description="The latest annotation of each reviewed case run, and the history of who said what.",
)
def list_annotations(eval_id: str, services: Svc, who: Who) -> AnnotationList:
    evals, annotations = _stores(services)
    _owned(evals, who, eval_id)
    return AnnotationList(
        latest=sorted(annotations.latest(who.tenant, eval_id).values(), key=lambda a: a.at),
        history=annotations.history(who.tenant, eval_id),
    )


@router.put(
    "/evals/{eval_id}/annotations/{item}",
    response_model=Annotation,
    summary="Review a case run",
    description="Mark one case run (``variant:case:repeat`` indexes, as in the viewer) pass or fail,"
    " override scores (0..1) and comment (at most 2000 characters; the whole annotation at most 8 KiB"
    " of JSON). The latest annotation is the"
    " case run's label; every one is kept in the history. The reviewer is the caller's API key.",
)
def annotate(eval_id: str, item: str, body: AnnotationInput, services: Svc, who: Who) -> Annotation:
    evals, annotations = _stores(services)
    meta = _owned(evals, who, eval_id)
    try:
        check_item(meta, item)
    except EvalNotFound as exc:
        raise ApiError(404, "not_found", str(exc)) from None
    try:
        return annotations.put(who.tenant, eval_id, item, body, who.key_id or "operator")
    except InvalidRequest as exc:
        raise ApiError(422, "invalid_request", exc.message) from None


@pages.get("/evals", include_in_schema=False)
@pages.get("/evals/", include_in_schema=False)
def index_page() -> HTMLResponse:
    return HTMLResponse(render_live("index"), headers=_page_headers())


@pages.get("/evals/{eval_id}", include_in_schema=False)
def eval_page(eval_id: str) -> HTMLResponse:
    # The page holds no data: its script reads the eval with the caller's key (404 if not theirs).
    return HTMLResponse(render_live("eval"), headers=_page_headers())


@cache
def _page_headers() -> dict[str, str]:
    script, style = inline_assets()
    return page_headers(scripts=[script], styles=[style])
