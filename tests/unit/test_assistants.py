"""Assistants: the configuration model, its validation against an agent's declared schema, how a
configuration derives the run's agent, the field-level diff, and the store (on a real redis-server):
immutable versions, rollback as a new version, bounds, and tenants kept apart."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from pydantic import BaseModel

from shared.agents import Agent
from shared.assistant_store import MAX_ASSISTANTS, AssistantsFull, AssistantStore
from shared.assistants import (
    AssistantConfig,
    AssistantConflict,
    AssistantExists,
    AssistantInvalid,
    UnknownAssistant,
    apply_config,
    check_config,
    diff_configs,
    prefill,
)
from shared.configurable import Configurable, schema_of
from shared.errors import ConfigError, InvalidRequest
from shared.keys import Keys
from shared.prompts import Prompt
from shared.request import RunRequest, new_run, validate_request
from shared.settings import Limits
from shared.state import REQUEST_FIELDS
from shared.tools import ToolContext, ToolSet, tool
from shared.workers import describe_agents
from tests.harness import RedisServer, wait_until


class Empty(BaseModel):
    pass


@tool(retry_safe=True)
def lookup(args: Empty, ctx: ToolContext) -> str:
    """Look something up."""
    return "found"


@tool(retry_safe=True)
def book(args: Empty, ctx: ToolContext) -> str:
    """Book something."""
    return "booked"


def _agent(configurable: Configurable | None) -> Agent:
    return Agent(
        name="concierge",
        model="openai:gpt-4o-mini",
        system_prompt=Prompt("You help guests of {hotel} in a {tone} tone."),
        tools=ToolSet([lookup, book]),
        approval_required=frozenset({"book"}),
        configurable=configurable,
    )


EVERYTHING = Configurable(
    model=("openai:gpt-4o", "openai:gpt-4o-mini"),
    system_prompt=True,
    template_values=("hotel", "tone"),
    tools=True,
    max_steps=(1, 20),
    policy=("on_tool_error",),
)


def test_a_field_the_agent_did_not_declare_is_refused_by_name() -> None:
    schema = schema_of(_agent(Configurable(system_prompt=True)))
    for config, field in (
        (AssistantConfig(model="openai:gpt-4o"), "model"),
        (AssistantConfig(tools=["lookup"]), "tools"),
        (AssistantConfig(max_steps=3), "max_steps"),
        (AssistantConfig(template_values={"hotel": "Ritz"}), "template_values"),
        (AssistantConfig(policy={"on_tool_error": "fail_fast"}), "policy"),
    ):
        with pytest.raises(AssistantInvalid) as caught:
            check_config("concierge", config, schema)
        assert caught.value.field == field
        assert field in caught.value.message
    check_config("concierge", AssistantConfig(system_prompt="Be brief."), schema)


def test_values_outside_what_was_declared_are_refused() -> None:
    schema = schema_of(_agent(EVERYTHING))
    for config, field in (
        (AssistantConfig(model="anthropic:claude"), "model"),
        (AssistantConfig(tools=["lookup", "shell"]), "tools"),
        (AssistantConfig(tools=["lookup", "lookup"]), "tools"),
        (AssistantConfig(max_steps=21), "max_steps"),
        (AssistantConfig(template_values={"secret": "x"}), "template_values"),
        (AssistantConfig(policy={"on_tool_error": "ignore"}), "policy"),
        (AssistantConfig(policy={"on_truncated": "fail"}), "policy"),
        (AssistantConfig(system_prompt="Unclosed {brace"), "system_prompt"),
    ):
        with pytest.raises(AssistantInvalid) as caught:
            check_config("concierge", config, schema)
        assert caught.value.field == field, config
    with pytest.raises(AssistantInvalid) as caught:
        check_config("concierge", AssistantConfig(), schema_of(_agent(None)))
    assert caught.value.field == "agent"


def test_parse_refuses_unknown_fields_and_oversized_configs() -> None:
    with pytest.raises(AssistantInvalid) as caught:
        AssistantConfig.parse({"temperature": 0.2})
    assert caught.value.field == "temperature"
    assert "'temperature' does not exist" in caught.value.message
    with pytest.raises(AssistantInvalid) as caught:
        AssistantConfig.parse({"system_prompt": "x" * 20_001})
    assert caught.value.field == "system_prompt"
    with pytest.raises(AssistantInvalid):
        AssistantConfig.parse({"tools": [f"t{i}" for i in range(129)]})
    with pytest.raises(AssistantInvalid):
        AssistantConfig.parse(["not", "an", "object"])
    assert AssistantConfig.parse({"max_steps": 4}).max_steps == 4


def test_apply_derives_the_runs_agent_and_leaves_the_registered_one_alone() -> None:
    agent = _agent(EVERYTHING)
    config = AssistantConfig(
        template_values={"hotel": "the {Ritz}"},
        tools=["lookup"],
        max_steps=3,
        policy={"on_tool_error": "fail_fast"},
    )
    derived = apply_config(agent, config)
    assert derived.tools.names == ["lookup"]
    assert derived.approval_required == frozenset()
    assert derived.max_steps == 3
    assert derived.policy.on_tool_error == "fail_fast"
    assert isinstance(derived.system_prompt, Prompt)
    # The value is filled in (its braces literal), the variable it did not set stays the run's.
    assert derived.system_prompt.variables == frozenset({"tone"})
    assert (
        derived.system_prompt.render("hi", {"tone": "warm"})
        == "You help guests of the {Ritz} in a warm tone."
    )
    assert agent.tools.names == ["lookup", "book"] and agent.max_steps == 10
    replaced = apply_config(
        agent, AssistantConfig(system_prompt="You are {name}.", template_values={"name": "Ana"})
    )
    assert isinstance(replaced.system_prompt, Prompt)
    assert replaced.system_prompt.render("hi", {}) == "You are Ana."
    assert apply_config(agent, AssistantConfig()) is agent


def test_prefill_keeps_literal_braces() -> None:
    assert prefill(Prompt("{{a}} {b} {c}"), {"b": "}{"}).render("", {"c": "3"}) == "{a} }{ 3"


def test_the_declaration_itself_is_checked_when_the_agent_is_built() -> None:
    with pytest.raises(ConfigError):
        _agent(Configurable(max_steps=(5, 2)))
    with pytest.raises(ConfigError):
        _agent(Configurable(policy=("on_invalid_action",)))
    with pytest.raises(ConfigError):
        _agent(Configurable(template_values=("input",)))


def test_workers_advertise_the_schema() -> None:
    from shared.agents import AgentRegistry

    registry = AgentRegistry()
    registry.add(_agent(EVERYTHING))
    (info,) = describe_agents(registry)
    assert info.configurable is not None
    assert info.configurable.tools == ["lookup", "book"]
    assert info.configurable.model == ["openai:gpt-4o", "openai:gpt-4o-mini"]
    assert info.configurable.policy == {"on_tool_error": ["fail_fast", "append_error_and_continue"]}


def test_diff_is_field_level() -> None:
    a = AssistantConfig(model="openai:gpt-4o", tools=["lookup"], policy={"on_tool_error": "fail_fast"})
    b = AssistantConfig(model="openai:gpt-4o-mini", max_steps=5, policy={"on_truncated": "fail"})
    changes = [(c.field, c.before, c.after, c.change) for c in diff_configs(a, b)]
    assert changes == [
        ("model", "openai:gpt-4o", "openai:gpt-4o-mini", "changed"),
        ("tools", ["lookup"], None, "removed"),
        ("max_steps", None, 5, "added"),
        ("policy.on_tool_error", "fail_fast", None, "removed"),
        ("policy.on_truncated", None, "fail", "added"),
    ]
    assert diff_configs(a, a) == []


def test_a_run_request_carries_its_assistant_into_the_stored_request() -> None:
    assert {"assistant", "assistant_version"} <= REQUEST_FIELDS
    request = validate_request(
        {"agent": "a", "input": "hi", "assistant": "bot", "assistant_version": 2}, Limits()
    )
    head = new_run("r1", request)
    assert (head.assistant, head.assistant_version) == ("bot", 2)
    for bad in (
        {"assistant": "no/slash"},
        {"assistant_version": 1},
        {"assistant": "b", "assistant_version": 0},
    ):
        with pytest.raises(InvalidRequest):
            validate_request({"agent": "a", "input": "hi", **bad}, Limits())


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[AssistantStore]:
    client: redis.Redis = redis_server.client()
    client.flushall()
    yield AssistantStore(client, Keys(prefix="asst-test:"))
    client.close()


def test_versions_are_appended_and_never_rewritten(store: AssistantStore) -> None:
    v1 = store.create("t1", "bot", "concierge", AssistantConfig(max_steps=3))
    v2 = store.update("t1", "bot", AssistantConfig(max_steps=5))
    assert (v1.version, v2.version) == (1, 2)
    assert store.get("t1", "bot").version == 2
    assert store.get("t1", "bot", 1).config.max_steps == 3
    back = store.rollback("t1", "bot", 1)
    assert (back.version, back.restored_from, back.config.max_steps) == (3, 1, 3)
    assert [v.version for v in store.versions("t1", "bot")] == [3, 2, 1]
    assert [v.version for v in store.versions("t1", "bot", before=3, limit=1)] == [2]
    assert store.get("t1", "bot", 2).config.max_steps == 5
    assert [c.field for c in store.diff("t1", "bot", 2, 3)] == ["max_steps"]
    with pytest.raises(AssistantExists):
        store.create("t1", "bot", "concierge", AssistantConfig())
    with pytest.raises(AssistantConflict):
        store.update("t1", "bot", AssistantConfig(), if_version=2)
    assert store.update("t1", "bot", AssistantConfig(), if_version=3).version == 4
    with pytest.raises(UnknownAssistant):
        store.get("t1", "bot", 5)


def test_tenants_never_see_each_others_assistants(store: AssistantStore) -> None:
    store.create("t1", "bot", "concierge", AssistantConfig(max_steps=3))
    with pytest.raises(UnknownAssistant):
        store.get("t2", "bot")
    with pytest.raises(UnknownAssistant):
        store.update("t2", "bot", AssistantConfig())
    assert store.list("t2") == []
    assert [a.name for a in store.list("t1")] == ["bot"]
    request = RunRequest(agent="concierge", input="hi", tenant="t2", assistant="bot")
    with pytest.raises(UnknownAssistant):
        store.pin(request)
    pinned, found = store.pin(request.model_copy(update={"tenant": "t1"}))
    assert pinned.assistant_version == 1 and found is not None
    with pytest.raises(AssistantInvalid):
        store.pin(request.model_copy(update={"tenant": "t1", "agent": "other"}))


def test_listing_pages_in_name_order(store: AssistantStore) -> None:
    for name in ("c", "a", "b"):
        store.create(None, name, "concierge", AssistantConfig())
    assert [a.name for a in store.list(None, limit=2)] == ["a", "b"]
    assert [a.name for a in store.list(None, after="b")] == ["c"]


def test_a_deleted_assistant_is_gone_for_requests_and_kept_for_its_pinned_runs(store: AssistantStore) -> None:
    store.create("t1", "bot", "concierge", AssistantConfig(max_steps=3))
    store.update("t1", "bot", AssistantConfig(max_steps=5))
    with pytest.raises(UnknownAssistant):
        store.delete("t2", "bot", keep_s=60)  # another tenant's: as unknown as a name never created
    assert store.get("t1", "bot").version == 2
    store.delete("t1", "bot", keep_s=60)
    request = RunRequest(agent="concierge", input="hi", tenant="t1", assistant="bot")
    for refused in (
        lambda: store.get("t1", "bot"),
        lambda: store.get("t1", "bot", 1),
        lambda: store.versions("t1", "bot"),
        lambda: store.diff("t1", "bot", 1, 2),
        lambda: store.update("t1", "bot", AssistantConfig()),
        lambda: store.rollback("t1", "bot", 1),
        lambda: store.pin(request),
        lambda: store.pin(request.model_copy(update={"assistant_version": 1})),
        lambda: store.delete("t1", "bot", keep_s=60),
    ):
        with pytest.raises(UnknownAssistant):
            refused()
    assert store.list("t1") == []
    # A run pinned to a version before the delete reads it still, for as long as it is kept.
    assert store.get("t1", "bot", 1, deleted=True).config.max_steps == 3
    ttl = store.redis.ttl(store.keys.assistant_versions("t1", "bot"))
    assert 0 < ttl <= 60

    # Created again: its numbering goes on, so version 1 still means what it meant, and it is kept.
    again = store.create("t1", "bot", "concierge", AssistantConfig(max_steps=7))
    assert again.version == 3
    assert store.get("t1", "bot", 1).config.max_steps == 3
    assert store.redis.ttl(store.keys.assistant_versions("t1", "bot")) == -1
    assert [a.name for a in store.list("t1")] == ["bot"]


def test_deleting_an_assistant_frees_its_place_under_the_tenants_cap(store: AssistantStore) -> None:
    for i in range(MAX_ASSISTANTS):
        store.create("t1", f"bot-{i}", "concierge", AssistantConfig())
    with pytest.raises(AssistantInvalid, match="at most"):
        store.create("t1", "one-more", "concierge", AssistantConfig())
    store.delete("t1", "bot-7", keep_s=60)
    assert store.create("t1", "one-more", "concierge", AssistantConfig()).version == 1
    with pytest.raises(AssistantInvalid, match="at most"):
        store.create("t1", "bot-7", "concierge", AssistantConfig())


#: A quota of a few versions, for the byte quota's tests.
SMALL_QUOTA = 3_000


@pytest.fixture
def small(store: AssistantStore) -> AssistantStore:
    """The same store with a quota of ``SMALL_QUOTA`` bytes for tenant t1 (t2 keeps the default)."""
    quotas = {"t1": SMALL_QUOTA}
    return AssistantStore(store.redis, store.keys, lambda tenant: quotas.get(tenant or "", 16 * 2**20))


def _prompt(n: int) -> AssistantConfig:
    return AssistantConfig(system_prompt="x" * n)


def test_a_tenants_versions_are_bounded_by_its_byte_quota(small: AssistantStore) -> None:
    small.create("t1", "bot", "concierge", _prompt(500))
    small.update("t1", "bot", _prompt(500))
    small.rollback("t1", "bot", 1)
    with pytest.raises(AssistantsFull) as refused:
        small.update("t1", "bot", _prompt(500))
    held = refused.value.details["held_bytes"]
    assert refused.value.details["max_assistant_bytes"] == SMALL_QUOTA
    assert 2_000 < held <= SMALL_QUOTA and refused.value.details["frees_at"] is None
    with pytest.raises(AssistantsFull):
        small.create("t1", "another", "concierge", _prompt(500))
    # Nothing was half-written: the refused version is not there, and a small one still fits.
    assert small.get("t1", "bot").version == 3
    assert small.update("t1", "bot", AssistantConfig()).version == 4
    # Another tenant's quota is its own.
    for i in range(5):
        small.create("t2", f"bot-{i}", "concierge", _prompt(500))


def test_deleted_assistants_count_until_their_versions_expire(small: AssistantStore) -> None:
    """Creating, filling and deleting names must not hold more than the quota: a deleted
    assistant's kept versions count until they expire, and then free their room."""
    small.create("t1", "a", "concierge", _prompt(600))
    small.create("t1", "b", "concierge", _prompt(600))
    small.delete("t1", "a", keep_s=1)
    with pytest.raises(AssistantsFull) as refused:
        small.create("t1", "c", "concierge", _prompt(600))
    frees_at = refused.value.details["frees_at"]
    assert frees_at is not None and 0 < frees_at - time.time() <= 1.5

    def fits() -> bool:
        try:
            small.create("t1", "c", "concierge", _prompt(600))
        except AssistantsFull:
            return False
        return True

    wait_until(fits, 15, interval=0.1, what="the deleted assistant's versions to stop counting")
    assert small.redis.exists(small.keys.assistant_versions("t1", "a")) == 0
    assert small.redis.zcard(small.keys.assistants_kept("t1")) == 0


def test_a_name_created_again_keeps_counting_its_old_versions(small: AssistantStore) -> None:
    small.create("t1", "bot", "concierge", _prompt(800))
    small.delete("t1", "bot", keep_s=600)
    again = small.create("t1", "bot", "concierge", _prompt(800))
    assert again.version == 2
    # Its versions are kept again (no expiry), so they no longer wait to expire as a deleted one's.
    assert small.redis.zcard(small.keys.assistants_kept("t1")) == 0
    with pytest.raises(AssistantsFull) as refused:
        small.update("t1", "bot", _prompt(800))
    assert refused.value.details["frees_at"] is None


def test_versions_written_before_the_quota_count_at_the_names_next_change(small: AssistantStore) -> None:
    small.create("t1", "old", "concierge", AssistantConfig())
    key = small.keys.assistant_versions("t1", "old")
    record = small.redis.lindex(key, 0)
    assert isinstance(record, bytes | str)  # ASCII JSON: as many characters as bytes
    # As an older release left it: versions in the list, no sizes kept for them.
    small.redis.rpush(key, *[record] * 40)
    small.redis.delete(small.keys.assistant_sizes("t1"))
    with pytest.raises(AssistantsFull) as refused:
        small.update("t1", "old", AssistantConfig())
    # Each version's JSON and a list entry (32 bytes), and the name's own keys (512 bytes).
    assert refused.value.details["held_bytes"] == 41 * (len(record) + 32) + 512


def test_each_name_counts_what_redis_spends_on_it_beside_its_json(small: AssistantStore) -> None:
    """Creating and deleting names with the smallest configuration counted only each version's
    JSON (about 180 bytes), while each name left about 350 bytes more in Redis for the retention:
    a tenant held three times its quota. Each name counts 512 bytes, each version 32."""
    made = 0
    with pytest.raises(AssistantsFull):
        for i in range(100):
            small.create("t1", f"n{i}", "concierge", AssistantConfig())
            small.delete("t1", f"n{i}", keep_s=600)
            made += 1
    record = small.redis.lindex(small.keys.assistant_versions("t1", "n0"), 0)
    assert isinstance(record, bytes | str)
    assert made == SMALL_QUOTA // (len(record) + 32 + 512)
