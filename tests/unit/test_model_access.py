"""Which models a tenant's requests may name for a run: its allow-list (stored, bounded,
normalized as the workers read a model), the check the API and the client make, and the
``wesichain keys models`` command."""

from __future__ import annotations

import argparse
import json

import fakeredis
import pytest

from producer.api.auth import Caller
from producer.api.commands import _models
from producer.api.errors import ApiError
from producer.api.namespaces import allowed_model, allowed_models
from shared.errors import InvalidRequest
from shared.keys import Keys
from shared.llm.names import split_model_string
from shared.request import MAX_NAME_CHARS
from shared.tenants import MAX_TENANT_MODELS, ModelNotAllowed, Tenants, check_model_allowed, model_pattern

BILLING = Caller(tenant="billing", key_id="k1")


def tenants() -> Tenants:
    return Tenants(fakeredis.FakeRedis(decode_responses=True), Keys())


def test_a_tenant_is_allowed_no_model_until_an_operator_says_so() -> None:
    t = tenants()
    assert t.models("billing") == () and t.settings("billing").models == ()
    # Stored as the workers read them (the provider in lower case, no spaces), sorted, once each.
    assert t.set_models("billing", ["OpenAI:gpt-4o", " openai:gpt-4o ", "ollama:*", "ollama:llama3:8b"]) == (
        "ollama:*",
        "ollama:llama3:8b",
        "openai:gpt-4o",
    )
    assert t.settings("billing").models == ("ollama:*", "ollama:llama3:8b", "openai:gpt-4o")
    assert t.models("search") == ()  # per tenant
    assert "billing" in t.names()
    assert t.set_models("billing", []) == () and t.settings("billing").models == ()


@pytest.mark.parametrize(
    "bad",
    [
        "gpt-4o",  # no provider
        "openai:",
        ":gpt-4o",
        "openai:gpt-*",  # a pattern is a whole provider's models or none
        "*:gpt-4o",
        "*:*",
        "react+openai:gpt-4o",  # allowing a model allows it wrapped: no separate entry
        "open ai:gpt-4o",
        "openai:" + "x" * MAX_NAME_CHARS,
    ],
)
def test_a_malformed_allowed_model_is_refused_and_nothing_changes(bad: str) -> None:
    t = tenants()
    t.set_models("billing", ["openai:gpt-4o"])
    with pytest.raises(InvalidRequest):
        t.set_models("billing", ["anthropic:*", bad])
    assert t.models("billing") == ("openai:gpt-4o",)


def test_an_unbounded_allow_list_is_refused() -> None:
    t = tenants()
    too_many = [f"openai:m{i:03}" for i in range(MAX_TENANT_MODELS + 1)]
    with pytest.raises(InvalidRequest, match=f"at most {MAX_TENANT_MODELS} models, not 101"):
        t.set_models("billing", too_many)
    assert t.models("billing") == ()
    assert len(t.set_models("billing", too_many[:-1])) == MAX_TENANT_MODELS


def test_a_model_is_allowed_as_the_workers_read_it_and_a_requested_star_is_no_pattern() -> None:
    allowed = (model_pattern("openai:gpt-4o"), model_pattern("ollama:*"))
    for model in ("openai:gpt-4o", "OpenAI:gpt-4o", " openai : gpt-4o", "react+openai:gpt-4o", "ollama:x:8b"):
        check_model_allowed("billing", model, allowed)
        # The check reads the model exactly as a worker building its adapter does.
        _, provider, name = split_model_string(model)
        assert f"{provider}:{name}" in allowed or f"{provider}:*" in allowed
    for model in (
        "openai:*",  # a star in a request is a model's name, not a pattern
        "openai:GPT-4o",  # model names compare exactly
        "openai:gpt-4o-mini",
        "openai:gpt-4o:extra",
        "anthropic:claude",
        "react+anthropic:claude",
        "openai:",
        "openai",
        "openai:" + "x" * MAX_NAME_CHARS,
    ):
        with pytest.raises(ModelNotAllowed) as refused:
            check_model_allowed("billing", model, allowed)
        assert refused.value.details == {"model": model[:MAX_NAME_CHARS], "allowed": list(allowed)}
    with pytest.raises(ModelNotAllowed):
        check_model_allowed("billing", "openai:gpt-4o", ())  # none allowed: none


def test_the_api_refuses_a_model_the_tenant_is_not_allowed_with_a_403() -> None:
    t = tenants()
    t.set_models("billing", ["openai:gpt-4o"])
    allowed_model(t, BILLING, None)  # naming none: the agent's
    allowed_model(t, BILLING, "openai:gpt-4o")
    with pytest.raises(ApiError) as refused:
        allowed_model(t, Caller(tenant="search", key_id="k2"), "openai:gpt-4o")
    assert (refused.value.status, refused.value.kind) == (403, "model_not_allowed")
    assert refused.value.details == {"model": "openai:gpt-4o", "allowed": []}
    assert "tenant search may not name the model 'openai:gpt-4o'" in refused.value.message
    with pytest.raises(ApiError) as other:
        allowed_model(t, BILLING, "openai:*")
    assert other.value.details == {"model": "openai:*", "allowed": ["openai:gpt-4o"]}
    # Without authentication the caller is the operator: any model, and no list to pass on.
    operator = Caller(tenant=None, key_id=None)
    allowed_model(t, operator, "anthropic:claude")
    assert allowed_models(t, operator) is None and allowed_models(t, BILLING) == ("openai:gpt-4o",)


def test_keys_models_allows_takes_back_and_clears(capsys: pytest.CaptureFixture[str]) -> None:
    t = tenants()

    def run(*allow: str, disallow: tuple[str, ...] = (), clear: bool = False) -> tuple[int, list[str]]:
        args = argparse.Namespace(tenant="billing", allow=list(allow), disallow=list(disallow), clear=clear)
        code = _models(t, args)
        out = capsys.readouterr().out
        return code, json.loads(out)

    assert run() == (0, [])
    assert run("OpenAI:gpt-4o", "ollama:*") == (0, ["ollama:*", "openai:gpt-4o"])
    assert run(disallow=("OPENAI:gpt-4o",)) == (0, ["ollama:*"])  # taken back as stored
    args = argparse.Namespace(tenant="billing", allow=["openai:gpt-*"], disallow=[], clear=False)
    assert _models(t, args) == 2
    refused = capsys.readouterr()
    assert refused.out == "" and "only a whole model may be '*'" in refused.err
    assert t.models("billing") == ("ollama:*",)  # nothing changed
    assert run("anthropic:claude", clear=True) == (0, ["anthropic:claude"])
    assert run(clear=True) == (0, []) and t.models("billing") == ()
