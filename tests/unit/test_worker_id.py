"""A process names its events' worker with one shared id, built again when its name or pid changes."""

from __future__ import annotations

import os

from shared import events as ev


def test_every_event_of_a_process_shares_one_worker_id_until_its_name_changes() -> None:
    first, name = ev.this_worker(), ev._identity
    assert ev.this_worker() is first and first.pid == os.getpid()
    try:
        ev.configure_worker_identity("renamed-worker")
        renamed = ev.this_worker()
        assert renamed.host == "renamed-worker" and renamed is not first
    finally:
        ev.configure_worker_identity(name or "")
    assert ev.this_worker().host == first.host
