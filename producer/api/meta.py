"""``/v1/agents``, ``/v1/versions``, ``/healthz`` and ``/readyz``."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from producer.api.models import AgentList, AgentView, Health, Readiness, VersionList, VersionView
from producer.api.runs import ERRORS, Svc, Who
from shared.settings import QUEUE_CALLBACKS, QUEUE_MODEL, QUEUE_TOOLS
from shared.versions import PinnedRuns, version_loads
from shared.workers import AgentInfo

__all__ = ["QUEUES", "agents", "healthz", "readyz", "router", "versions"]

router = APIRouter()

#: Queues a working deployment has consumers on.
QUEUES = (QUEUE_MODEL, QUEUE_TOOLS, QUEUE_CALLBACKS)


@router.get("/v1/agents", response_model=AgentList, responses=ERRORS, summary="Agents live workers serve")
def agents(services: Svc, who: Who) -> AgentList:
    counts: dict[str, int] = {}
    infos: dict[str, AgentInfo] = {}
    for worker in services.client.workers.live():
        record = worker.record
        if record.consuming or record.consumer_state == "saturated":
            for agent in record.agents:
                counts[agent.name] = counts.get(agent.name, 0) + 1
                infos.setdefault(agent.name, agent)
    return AgentList(agents=[AgentView(**infos[n].model_dump(), workers=counts[n]) for n in sorted(infos)])


@router.get(
    "/v1/versions",
    response_model=VersionList,
    responses=ERRORS,
    summary="Agent versions live in the pool, and the caller's runs each holds",
    description="Each agent version that live workers serve, or that the caller's live runs are"
    " pinned to: how many live workers serve it (and how many of those drain), and how many of the"
    " caller's own runs are pinned to it, queued or running, and parked. Other tenants' runs are"
    " never counted, nor are versions only they hold listed. A version with the caller's active runs"
    " and no worker is `waiting`: those runs wait, holding nothing, until a worker serving it (or one"
    " taking it over) starts. Draining is an operator's command (`wesichain workers drain`), not an"
    " API call.",
)
def versions(services: Svc, who: Who) -> VersionList:
    client = services.client
    loads = version_loads(PinnedRuns(client.store), client.workers.live(), who.tenant)
    return VersionList(
        versions=[
            VersionView(
                agent=v.agent,
                version=v.version,
                workers=v.workers,
                draining=v.draining,
                active_runs=v.active,
                parked_runs=v.parked,
                waiting=v.waiting,
            )
            for v in loads
            if v.workers or v.active or v.parked
        ]
    )


@router.get("/healthz", response_model=Health, summary="The process is up")
def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "Not ready: see problems."}},
    summary="Redis answers and every queue has a live consuming worker",
)
def readyz(services: Svc) -> JSONResponse:
    problems: list[str] = []
    queues = dict.fromkeys(QUEUES, 0)
    try:
        services.store.redis.ping()
        redis_ok = True
        for worker in services.client.workers.live():
            if worker.record.consuming or worker.record.consumer_state == "saturated":
                for queue in worker.record.queues:
                    if queue in queues:
                        queues[queue] += 1
    except Exception as exc:  # any failure to reach Redis means not ready
        redis_ok = False
        problems.append(f"Redis: {type(exc).__name__}: {str(exc)[:200]}")
    if redis_ok:
        problems.extend(f"no live worker consumes {q}" for q, n in queues.items() if n == 0)
    ready = Readiness(ready=not problems, redis=redis_ok, queues=queues, problems=problems)
    return JSONResponse(ready.model_dump(mode="json"), status_code=200 if ready.ready else 503)
