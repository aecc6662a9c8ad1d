"""A tenant's eval listing through a real ``wesichain api`` on a real redis-server: its own evals,
however many other tenants created since, and no sign of theirs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from producer.client import Client
from producer.evals.client import EvalClient
from shared.keys import Keys
from shared.tenants import Tenants
from tests.api_support import ApiProcess, bearer
from tests.broker import Settings
from tests.harness import RedisServer

AGENTS = "tests.agents_evals"


def _spec(tmp: Path) -> Path:
    (tmp / "cases.jsonl").write_text(json.dumps({"id": "c1", "input": "double 1", "expected": "2"}) + "\n")
    spec = tmp / "spec.toml"
    spec.write_text(
        'name = "listing"\ndataset = "cases.jsonl"\n[[variants]]\nname = "a"\nagent = "doubler"\n'
        'model = "scripted:evals-a"\n[[scorers]]\nkind = "exact"\n'
    )
    return spec


@pytest.fixture
def served(tmp_path: Path) -> Iterator[dict[str, Any]]:
    server = RedisServer().start()
    try:
        client = Client(Settings(redis_url=server.url, agents_module=AGENTS))
        api = ApiProcess(server.url, env={"WESICHAIN_AGENTS": AGENTS}).start()
        try:
            tenants = Tenants(server.client(), Keys())
            yield {
                "api": api.url,
                "evals": EvalClient(client),
                "spec": _spec(tmp_path),
                "acme": tenants.create_key("acme")[0],
                "rival": tenants.create_key("rival")[0],
            }
        finally:
            api.stop()
            client.close()
    finally:
        server.stop()


def _listed(api: str, key: str, limit: int) -> list[str]:
    with httpx.Client(base_url=api, headers=bearer(key), timeout=30) as http:
        answer = http.get("/v1/evals", params={"limit": limit})
    assert answer.status_code == 200, answer.text
    return [entry["id"] for entry in answer.json()["evals"]]


def test_other_tenants_evals_neither_crowd_out_a_tenants_listing_nor_show_in_it(
    served: dict[str, Any],
) -> None:
    evals: EvalClient = served["evals"]
    evals.submit_file(served["spec"], eval_id="acme-nightly", tenant="acme", check_agents=False)
    assert _listed(served["api"], served["acme"], 1) == ["acme-nightly"]
    # Another tenant creates more evals than ten times the acme listing's limit.
    for n in range(11):
        evals.submit_file(served["spec"], eval_id=f"rival-{n}", tenant="rival", check_agents=False)
    # Acme's newest eval is still listed (it once read only the newest ten of every tenant's, so
    # its listing came back empty, and told it that others had created ten evals since).
    assert _listed(served["api"], served["acme"], 1) == ["acme-nightly"]
    assert _listed(served["api"], served["acme"], 50) == ["acme-nightly"]
    assert _listed(served["api"], served["rival"], 2) == ["rival-10", "rival-9"]
