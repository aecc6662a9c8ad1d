"""``wesichain api`` whose submits stop inside their reservation window, to be SIGKILLed there.

``python -m tests.chaos.paused_api api --redis URL ...`` runs the real CLI's ``api`` command (one
uvicorn process) with one change: every submit served on a worker thread, right after its
tenant's in-flight reservation is taken and before its run is created, pushes this process's pid
onto :data:`PAUSED_KEY` and sleeps until the test kills the process. (A submit served on the event
loop holds no reservation: it is admitted in the step that creates its run.)
"""

from __future__ import annotations

import os
import sys
import time

from producer.admission import Reservation
from producer.api.limits import SubmitGate
from producer.cli import main
from shared.redis_client import connect
from shared.settings import Settings

#: A list: one pid per submit paused with its reservation held.
PAUSED_KEY = "test:fault:api_reserved"

_reserve = SubmitGate.reserve


def _reserve_then_stop(self: SubmitGate, tenant: str) -> Reservation:
    _reserve(self, tenant)  # held, never released: the process dies holding it
    connect(Settings.from_env()).rpush(PAUSED_KEY, str(os.getpid()))
    time.sleep(600)  # the test SIGKILLs this process meanwhile
    raise SystemExit("not killed")


if __name__ == "__main__":
    SubmitGate.reserve = _reserve_then_stop  # type: ignore[method-assign]
    sys.exit(main(sys.argv[1:]))
