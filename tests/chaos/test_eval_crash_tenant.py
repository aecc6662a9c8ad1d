"""A tenant's eval survives its pool being SIGKILLed, and stays the tenant's.

An eval created for tenant ``acme`` is under way when every worker (each one's process group) is
SIGKILLed and restarted, twice: case runs in flight, scorings and pumps die with them, and the
sweeper creates, scores and pumps what they left. The eval completes with one run and one result
per case; every case run, those the sweeper's repairs created included, runs as ``acme``; a scoring
cut by a kill is redone, but only one result is recorded. Over the HTTP API, ``acme``'s key reads
the eval, its results and its case runs, and another tenant's key gets 404 for each of them.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from pathlib import Path

import httpx
import pytest

from producer.api_client import ApiClient
from producer.client import Client
from producer.evals.client import EvalClient
from shared.evals.errors import EvalNotFound
from shared.evals.store import Item, run_id_of
from shared.keys import Keys
from shared.state import EvalLink
from shared.tenants import Tenants
from tests.api_support import ApiProcess, bearer
from tests.broker import Settings
from tests.chaos.support import EVAL_AGENTS, kill_pool, write_doubling_eval
from tests.eval_scorers import SCORED_KEY
from tests.harness import RedisServer, WorkerProcess, wait_until

TENANT, RIVAL = "acme", "rival"
CASES = 48
CAP = 6


def test_a_tenants_eval_finishes_once_through_pool_kills_and_stays_the_tenants(
    server: RedisServer, eval_pool: list[WorkerProcess], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    spec = write_doubling_eval(tmp_path, "tenant-crash", "t", CASES, CAP)
    client = Client(Settings(redis_url=server.url, agents_module=EVAL_AGENTS))
    request.addfinalizer(client.close)
    evals = EvalClient(client)
    eval_id, created = evals.submit_file(spec, eval_id="acme-nightly", tenant=TENANT)
    assert created and evals.store.meta(eval_id).tenant == TENANT

    wait_until(lambda: evals.progress(eval_id).recorded >= CASES // 4, timeout=90, what="a quarter")
    kill_pool(eval_pool)
    wait_until(lambda: evals.progress(eval_id).recorded >= CASES * 3 // 5, timeout=120, what="60%")
    kill_pool(eval_pool)
    done = evals.wait(eval_id, timeout=180)

    assert done.meta.status == "completed" and done.meta.tenant == TENANT and done.recorded == CASES
    assert (done.counts[0].done, done.counts[0].passed, done.counts[0].failed) == (CASES, CASES, 0)
    # One result per case, recorded once.
    results = evals.results(eval_id)
    assert sorted(r.case_id for r in results) == sorted(f"t{m}" for m in range(1, CASES + 1))
    assert Counter(r.item for r in results) == Counter({str(Item(0, c, 0)): 1 for c in range(CASES)})
    # One run per case, each the tenant's, whoever created it (a pump or the sweeper's repair).
    heads = [client.store.load(run_id_of(eval_id, Item(0, c, 0))) for c in range(CASES)]
    assert all(h is not None for h in heads)
    assert Counter(h.tenant for h in heads if h is not None) == Counter({TENANT: CASES})
    assert all(isinstance(h.link, EvalLink) and h.link.eval_id == eval_id for h in heads if h is not None)
    page = client.list_runs(tenant=TENANT, limit=500)
    assert len(page.runs) == CASES and page.next_cursor is None  # no second run of any case
    assert client.list_runs(limit=500).runs == []  # and none outside the tenant
    # Scored at least once each; twice only where a kill cut a scoring (never recorded twice).
    scored = {str(k): int(v) for k, v in server.client().hgetall(SCORED_KEY).items()}
    assert set(scored) == {f"t{m}" for m in range(1, CASES + 1)} and max(scored.values()) <= 2
    assert sum(scored.values()) - CASES <= 2 * CAP

    # Over the HTTP API: the tenant reads all of it, another tenant none of it.
    tenants = Tenants(server.client(), Keys())
    key, _ = tenants.create_key(TENANT)
    rival, _ = tenants.create_key(RIVAL)
    api = ApiProcess(server.url, env={"WESICHAIN_AGENTS": EVAL_AGENTS}).start()
    try:
        with ApiClient(api.url, key) as http:
            assert [e["id"] for e in http.evals.list()] == [eval_id]
            rows = list(csv.DictReader(io.StringIO(http.evals.results(eval_id))))
            assert sorted(r["case_id"] for r in rows) == sorted(f"t{m}" for m in range(1, CASES + 1))
            assert {r["passed"] for r in rows} == {"True"}
        with ApiClient(api.url, rival) as attacker:
            assert attacker.evals.list() == []
            with pytest.raises(EvalNotFound):
                attacker.evals.get(eval_id)
        with httpx.Client(base_url=api.url, headers=bearer(rival), timeout=30) as attacker_http:
            for path in (
                f"/v1/evals/{eval_id}/results",
                f"/v1/runs/{run_id_of(eval_id, Item(0, 0, 0))}",
                f"/v1/runs/{run_id_of(eval_id, Item(0, CASES - 1, 0))}/events",
            ):
                answer = attacker_http.get(path)
                assert answer.status_code == 404 and answer.json()["error"]["kind"] == "not_found", path
        with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as owner_http:
            run = owner_http.get(f"/v1/runs/{run_id_of(eval_id, Item(0, CASES - 1, 0))}").json()
            assert run["status"] == "completed" and run["link"] == {
                "kind": "eval",
                "eval_id": eval_id,
                "item": f"0:{CASES - 1}:0",
            }
    finally:
        api.stop()
