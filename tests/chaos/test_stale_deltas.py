"""Token deltas of a think that lost its run: dropped, whether the run left its step or only its phase.

A think streams its text in flushes (``worker/model_call.py``) until it notices its claim was taken
(its renewal fails, or the commit is fenced). Whatever it flushes meanwhile must not land in the run's
stream: not in a later step's place, and not after its own step's phase was committed by another
delivery (``emit_live.lua`` checks the run's step and the phase claim the delivery holds).
"""

from __future__ import annotations

import uuid

from producer.client import Client
from shared import events as ev
from shared.state import Phase
from tests.agents_fixture import RELEASE_KEY
from tests.chaos.support import Cluster, check_clean_run, events_of, idem, wait_tool_started

#: Leases long enough that no sweeper takeover mixes into the run.
CALM_ENV = {"WESICHAIN_LEASE_S": "10", "WESICHAIN_QUEUED_LEASE_S": "30"}


def test_token_deltas_of_a_think_that_lost_its_run_are_dropped(cluster: Cluster, client: Client) -> None:
    cluster.start(1, concurrency=2, env=CALM_ENV)
    r = client.store.redis
    handle = client.submit("late_delivery", "go")
    run_id = handle.run_id
    wait_tool_started(r, idem(run_id, 2))
    head = handle.status()
    assert head.phase is Phase.ACTING and head.step == 2
    before = int(r.xlen(client.store.keys.events(run_id)))

    def stale(step: int) -> int:
        """What the think of ``step`` appends, flushing its text after its claim was taken from it."""
        delta = ev.TokenDelta(run_id=run_id, step=step, text="stale text")
        return client.store.emit(run_id, [delta], step=step, claim_token=uuid.uuid4().hex)

    assert stale(1) == 0, "deltas of a step the run left were appended"
    assert stale(2) == 0, "deltas of a think whose step was committed by another were appended"
    assert int(r.xlen(client.store.keys.events(run_id))) == before

    r.set(RELEASE_KEY + run_id, 1)
    check_clean_run(client, run_id, "late_delivery")
    deltas = [e for e in events_of(handle) if isinstance(e, ev.TokenDelta)]
    assert "stale text" not in [d.text for d in deltas]
    assert "".join(d.text for d in deltas if d.step == 3) == "late deliveries changed nothing"
