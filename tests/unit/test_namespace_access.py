"""Who may send work to a queue namespace over the API: a tenant's allow-list (stored, bounded,
normalized), the check the API makes, the bodies' validation, and a pipeline run's namespace
stored with it and routing its first move."""

from __future__ import annotations

import argparse
import json

import fakeredis
import pytest
from pydantic import ValidationError

from producer.api.app import openapi_document
from producer.api.auth import Caller
from producer.api.commands import _namespaces
from producer.api.errors import ApiError
from producer.api.models import SubmitBody
from producer.api.namespaces import allowed_namespace
from producer.api.pipelines import PipelineSubmit
from shared.errors import InvalidRequest
from shared.keys import Keys
from shared.pipeline.status import summary_of
from shared.pipeline.store import PipelineStore
from shared.pipeline.tasks import TASK_PIPELINE_ADVANCE, advance_task
from shared.tenants import MAX_TENANT_NAMESPACES, Tenants


def tenants() -> Tenants:
    return Tenants(fakeredis.FakeRedis(decode_responses=True), Keys())


def test_a_tenant_is_allowed_no_namespace_but_the_default_one_until_an_operator_says_so() -> None:
    t = tenants()
    assert t.namespaces("billing") == () and t.settings("billing").namespaces == ()
    # Sorted, without duplicates; the default namespace is everyone's, so it is not stored.
    assert t.set_namespaces("billing", ["nightly", "backfill", "nightly", "wesichain"]) == (
        "backfill",
        "nightly",
    )
    assert t.namespaces("billing") == ("backfill", "nightly")
    assert t.settings("billing").namespaces == ("backfill", "nightly")
    assert t.namespaces("search") == ()  # per tenant
    assert "billing" in t.names()
    assert t.set_namespaces("billing", []) == () and t.namespaces("billing") == ()


def test_a_malformed_or_an_unbounded_allow_list_is_refused_and_nothing_changes() -> None:
    t = tenants()
    t.set_namespaces("billing", ["nightly"])
    with pytest.raises(InvalidRequest, match="namespace 'a.b' must be 1..48"):
        t.set_namespaces("billing", ["ok", "a.b"])
    too_many = [f"ns{i}" for i in range(MAX_TENANT_NAMESPACES + 1)]
    with pytest.raises(InvalidRequest, match=f"at most {MAX_TENANT_NAMESPACES} namespaces, not 101"):
        t.set_namespaces("billing", too_many)
    assert t.namespaces("billing") == ("nightly",)
    assert t.set_namespaces("billing", too_many[:-1])[-1] == "ns99"


def test_the_api_lets_a_tenant_name_only_the_namespaces_it_is_allowed() -> None:
    t = tenants()
    t.set_namespaces("billing", ["nightly"])
    billing = Caller(tenant="billing", key_id="k1")
    assert allowed_namespace(t, billing, None) is None
    assert allowed_namespace(t, billing, "wesichain") is None  # the default one: always
    assert allowed_namespace(t, billing, "nightly") == "nightly"
    with pytest.raises(ApiError) as refused:
        allowed_namespace(t, Caller(tenant="search", key_id="k2"), "nightly")
    assert (refused.value.status, refused.value.kind) == (403, "forbidden")
    assert refused.value.details == {"namespace": "nightly", "allowed": []}
    assert "tenant search may not send runs to the queue namespace 'nightly'" in refused.value.message
    with pytest.raises(ApiError) as other:
        allowed_namespace(t, billing, "backfill")
    assert other.value.details == {"namespace": "backfill", "allowed": ["nightly"]}
    # Without authentication the caller is the operator: any well-formed namespace.
    assert allowed_namespace(t, Caller(tenant=None, key_id=None), "backfill") == "backfill"
    with pytest.raises(ApiError) as malformed:
        allowed_namespace(t, billing, "a.b")
    assert (malformed.value.status, malformed.value.kind) == (422, "invalid_request")


@pytest.mark.parametrize("bad", ["", "a.b", "a b", "-x", "x" * 49, "nïght"])
def test_the_bodies_refuse_a_malformed_namespace(bad: str) -> None:
    with pytest.raises(ValidationError, match="namespace"):
        SubmitBody.model_validate({"agent": "a", "input": "hi", "namespace": bad})
    with pytest.raises(ValidationError, match="namespace"):
        PipelineSubmit.model_validate({"pipeline": "p", "input": "hi", "namespace": bad})
    assert SubmitBody.model_validate({"agent": "a", "input": "hi", "namespace": "n-1_x"}).namespace == "n-1_x"


def test_the_openapi_document_states_the_namespace_with_its_pattern_and_bounds() -> None:
    schemas = openapi_document()["components"]["schemas"]
    for body in ("SubmitBody", "PipelineSubmit"):
        field = schemas[body]["properties"]["namespace"]
        text = next(option for option in field["anyOf"] if option.get("type") == "string")
        assert text == {
            "type": "string",
            "minLength": 1,
            "maxLength": 48,
            "pattern": "^[A-Za-z0-9][A-Za-z0-9_-]*$",
        }
        assert "403" in field["description"]
    assert "namespace" in schemas["RunView"]["properties"]


def test_keys_namespaces_allows_takes_back_and_clears(capsys: pytest.CaptureFixture[str]) -> None:
    t = tenants()

    def run(*allow: str, disallow: tuple[str, ...] = (), clear: bool = False) -> list[str]:
        args = argparse.Namespace(tenant="billing", allow=list(allow), disallow=list(disallow), clear=clear)
        assert _namespaces(t, args) == 0
        printed: list[str] = json.loads(capsys.readouterr().out)
        return printed

    assert run() == []
    assert run("nightly", "backfill") == ["backfill", "nightly"]
    assert run(disallow=("backfill",)) == ["nightly"]
    assert run("eu", clear=True) == ["eu"]
    assert run(clear=True) == [] and t.namespaces("billing") == ()


def test_a_pipeline_run_keeps_its_namespace_and_its_first_move_goes_to_the_namespace() -> None:
    store = PipelineStore(fakeredis.FakeRedis(decode_responses=True), Keys())
    assert store.create("p1", "chain", "in", "billing", "nightly")
    assert store.create("p2", "chain", "in", "billing")
    spaced, plain = store.meta("p1"), store.meta("p2")
    assert spaced is not None and plain is not None
    assert (spaced.namespace, plain.namespace) == ("nightly", None)
    assert summary_of(spaced).namespace == "nightly" and summary_of(plain).namespace is None
    move = advance_task("p1", -1, "nightly")
    assert (move.name, move.queue, move.arguments) == (
        TASK_PIPELINE_ADVANCE,
        "nightly.model",
        {"pipeline_id": "p1", "from_seq": -1},
    )
    assert advance_task("p2", -1).queue is None  # the Celery routes: the default model queue
