"""The wesichain pytest plugin's fixtures, used the way a project testing its agents uses them.

The fixtures come from the installed plugin (entry point ``pytest11``: ``wesichain``), not from
an import; ``conftest.py`` points them at ``tests.plugin.agents``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from producer.client import Client
from shared.agents import AgentRegistry, load_registry
from shared.errors import ConfigError
from shared.llm.base import ModelResponse
from shared.llm.scripted import reply
from shared.messages import Message, ToolMessage
from shared.state import Phase
from tests.harness import wait_until
from worker.pytest_plugin import RunAgent, ScriptedModels, WesichainRun

REFUND = ("refund", {"order_id": "A7", "cents": 500})
ONE_HOP = [
    "RunStarted",
    "StepStarted",
    "ModelResponded",
    "ToolDispatched",
    "ToolCompleted",
    "StepStarted",
    "ModelResponded",
    "Completed",
]


def test_a_listed_script_drives_a_tool_hop(
    wesichain_scripted: ScriptedModels, wesichain_run: RunAgent
) -> None:
    model = wesichain_scripted("support", [reply(None, REFUND), "Refunded 5 euros."])
    run = wesichain_run("support", "Refund 5 euros on order A7")
    assert run.phase is Phase.COMPLETED
    assert run.head.model == model and model.startswith("scripted:pytest-support-")
    run.assert_completed("Refunded 5 euros.")
    run.assert_kinds(ONE_HOP)
    run.assert_tool_calls([REFUND])
    assert run.tool_results == [("refund", True, "refunded 500 cents on A7")]
    run.assert_invariants()
    # The streamed answer is there too, but kept out of kinds.
    assert "".join(e.text for e in run.events if e.kind == "TokenDelta") == "Refunded 5 euros."


def test_a_function_script_answers_from_the_conversation(
    wesichain_scripted: ScriptedModels, wesichain_run: RunAgent
) -> None:
    def script(messages: Sequence[Message]) -> ModelResponse | str:
        results = [m for m in messages if isinstance(m, ToolMessage)]
        if not results:
            return reply(None, ("lookup_order", {"order_id": "B2"}), ("lookup_order", {"order_id": "C3"}))
        return f"looked up {len(results)} orders: " + " / ".join(m.content for m in results)

    wesichain_scripted("support", script)
    run = wesichain_run("support", "What did I pay for B2 and C3?")
    run.assert_completed()
    assert run.answer == (
        'looked up 2 orders: {"order_id":"B2","paid_cents":1250} / {"order_id":"C3","paid_cents":1250}'
    )
    run.assert_tool_calls([("lookup_order", {"order_id": "B2"}), ("lookup_order", {"order_id": "C3"})])
    assert [ok for _, ok, _ in run.tool_results] == [True, True]
    run.assert_invariants()


def test_the_latest_script_of_an_agent_wins_and_model_overrides_it(
    wesichain_scripted: ScriptedModels, wesichain_run: RunAgent
) -> None:
    first = wesichain_scripted("support", ["first script"])
    wesichain_scripted("support", ["second script"])
    wesichain_run("support", "hello").assert_completed("second script")
    wesichain_run("support", "hello", model=first).assert_completed("first script")


def test_a_run_that_outlives_its_script_fails_and_says_why(
    wesichain_scripted: ScriptedModels, wesichain_run: RunAgent
) -> None:
    wesichain_scripted("support", [reply(None, REFUND)])
    run = wesichain_run("support", "Refund order A7")
    assert run.phase is Phase.FAILED
    run.assert_invariants()  # a failed run keeps them too
    with pytest.raises(AssertionError) as failure:
        run.assert_completed()
    assert str(failure.value).splitlines() == [
        f"run {run.run_id} ended failed, not completed:"
        " ModelTransport: scripted model has no reply for turn 1",
        "  events: RunStarted, StepStarted, ModelResponded, ToolDispatched, ToolCompleted, StepStarted,"
        " StepFailed, Failed",
    ]


def test_wrong_expectations_fail_with_what_differs(
    wesichain_scripted: ScriptedModels, wesichain_run: RunAgent
) -> None:
    wesichain_scripted("support", [reply(None, REFUND), "Refunded."])
    run = wesichain_run("support", "Refund order A7")
    with pytest.raises(AssertionError) as kinds:
        run.assert_kinds(["RunStarted", "StepStarted", "ModelResponded", "Completed"])
    assert str(kinds.value).splitlines() == [
        f"run {run.run_id}: event kinds differ at #3 (expected Completed, got ToolDispatched)",
        "  expected: RunStarted, StepStarted, ModelResponded, Completed",
        "  actual:   " + ", ".join(ONE_HOP),
    ]
    with pytest.raises(AssertionError) as calls:
        run.assert_tool_calls([("refund", {"order_id": "A7", "cents": 50})])
    assert str(calls.value).splitlines() == [
        f"run {run.run_id}: tool calls differ at #0",
        "  expected: refund({'order_id': 'A7', 'cents': 50})",
        "  actual:   refund({'order_id': 'A7', 'cents': 500})",
    ]
    with pytest.raises(
        AssertionError, match=r"answer differs\n  expected: 'Done\.'\n  actual:   'Refunded\.'"
    ):
        run.assert_completed("Done.")


def test_the_client_covers_runs_that_park_for_approval(
    wesichain_client: Client, wesichain_scripted: ScriptedModels
) -> None:
    model = wesichain_scripted("careful", [reply(None, REFUND), "Refunded after review."])
    handle = wesichain_client.submit("careful", "Refund order A7", model=model)
    wait_until(lambda: handle.status().phase is Phase.AWAITING_APPROVAL, 10, what="the run to park")
    parked = [e.kind for e in handle.events(follow=False) if e.kind != "TokenDelta"]
    assert parked[-1] == "AwaitingApproval" and "ToolDispatched" not in parked
    handle.approve("ok")
    run = WesichainRun.collect(handle)
    run.assert_completed("Refunded after review.")
    run.assert_tool_calls([REFUND])
    assert run.kinds.index("AwaitingApproval") < run.kinds.index("ToolDispatched")
    run.assert_invariants()


def test_scripting_an_unknown_agent_names_the_known_ones(wesichain_scripted: ScriptedModels) -> None:
    with pytest.raises(ConfigError, match=r"unknown agent 'suport' \(registered: careful, support\)"):
        wesichain_scripted("suport", ["hi"])


def test_scripted_models_are_forgotten_after_the_test() -> None:
    registry = AgentRegistry()
    for agent in load_registry("tests.plugin.agents").names:
        registry.add(load_registry("tests.plugin.agents").get(agent))
    models = ScriptedModels(registry)
    model = models("support", ["hi"])
    name = model.removeprefix("scripted:")
    assert registry.model(name) is not None and models.model_for("support") == model
    models.remove_all()
    assert registry.model(name) is None and models.model_for("support") is None


def test_the_embedded_worker_loads_the_overridden_agents_module(wesichain_client: Client) -> None:
    assert wesichain_client.settings.agents_module == "tests.plugin.agents"
    assert wesichain_client.settings.embedded
