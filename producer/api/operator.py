"""``GET /v1/pool``: the operator view of the pool (``shared/pool.py``).

Pool-wide data (worker hosts and pids, every queue, pool-wide leases, dead workers) is operator
information: it is shown to the operator (authentication off, on a loopback server) and to the
keys of tenants an operator made operators (``wesichain keys operator --tenant T --on``). Any
other tenant sees pool-wide counts (workers, slots, the default queues' depths) and its own runs
only. No caller ever sees another tenant's run ids.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from producer.api.auth import Caller
from producer.api.runs import ERRORS, Svc, Who
from producer.api.services import Services
from shared.pool import PoolView
from shared.pool_records import MAX_SERIES_MINUTES

__all__ = ["pool", "router"]

router = APIRouter()


@router.get(
    "/v1/pool",
    response_model=PoolView,
    responses=ERRORS,
    summary="The worker pool: workers, queues, leases, parked runs, runs ended per minute",
    description="What the console's operator view shows. An operator (authentication off, or a key of"
    " a tenant made an operator with `wesichain keys operator --tenant T --on`) sees every live worker"
    " (queues, pool, slots in use, last heartbeat), every known queue's depth, pool-wide leases and"
    " parked runs, recently dead workers and the whole pool's runs ended per minute (`scope`:"
    " `operator`). Any other key sees pool-wide worker and slot counts, the default queues' depths,"
    " and its own runs only: its leases, parked runs and runs ended per minute (`scope`: `tenant`)."
    " `running` lists the caller's own runs, never another tenant's.",
)
async def pool(
    services: Svc,
    who: Who,
    minutes: Annotated[int, Query(ge=1, le=MAX_SERIES_MINUTES, description="Minutes of runs ended.")] = 60,
) -> PoolView:
    return await run_in_threadpool(_pool, services, who, minutes)


def _pool(services: Services, who: Caller, minutes: int) -> PoolView:
    operator = who.tenant is None or services.tenants.is_operator(who.tenant)
    return services.client.pool(who.tenant, operator=operator, minutes=minutes)
