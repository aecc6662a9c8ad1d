"""``wesichain api`` whose submits stop inside their reservation window, to be SIGKILLed there.

``python -m tests.chaos.paused_api api --redis URL ...`` runs the real CLI's ``api`` command (one
uvicorn process) with one change: every submit, right after its tenant's in-flight reservation is
taken and before its run is created, pushes this process's pid onto :data:`PAUSED_KEY` and sleeps
until the test kills the process, whichever way serves it (a worker thread, or the event loop
once the process's caches are fresh: there it waits without blocking the loop).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from producer.admission import Reservation
from producer.api.limits import SubmitGate
from producer.cli import main
from shared.redis_client import connect
from shared.settings import Settings
from shared.tenants import TenantLimits

#: A list: one pid per submit paused with its reservation held.
PAUSED_KEY = "test:fault:api_reserved"

_reserve = SubmitGate.reserve
_reserve_on_loop = SubmitGate.reserve_on_loop


def _reserve_then_stop(self: SubmitGate, tenant: str) -> Reservation:
    _reserve(self, tenant)  # held, never released: the process dies holding it
    connect(Settings.from_env()).rpush(PAUSED_KEY, str(os.getpid()))
    time.sleep(600)  # the test SIGKILLs this process meanwhile
    raise SystemExit("not killed")


async def _reserve_on_loop_then_stop(self: SubmitGate, tenant: str, limits: TenantLimits) -> Reservation:
    await _reserve_on_loop(self, tenant, limits)
    connect(Settings.from_env()).rpush(PAUSED_KEY, str(os.getpid()))
    await asyncio.sleep(600)
    raise SystemExit("not killed")


if __name__ == "__main__":
    SubmitGate.reserve = _reserve_then_stop  # type: ignore[method-assign]
    SubmitGate.reserve_on_loop = _reserve_on_loop_then_stop  # type: ignore[method-assign]
    sys.exit(main(sys.argv[1:]))
