"""Chaos suite: real redis-server, real worker processes, SIGKILL at every point of a run.

    pytest -m chaos                                   # the whole suite, a short soak included
    WESICHAIN_SOAK_S=600 pytest tests/chaos/test_soak.py
    WESICHAIN_SOAK_SEED=1795267317 pytest tests/chaos/test_soak.py   # replay a soak's kill schedule

``WESICHAIN_CHAOS_REPORT=path.jsonl`` appends every measured recovery time and the soak's summary
as JSON lines. Each test runs its own redis-server and workers (see ``conftest.py``); the checks
they share are in ``support.py``.
"""
