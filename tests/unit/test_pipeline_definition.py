"""Pipelines are checked when registered: unknown agents, types between steps, cycles."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import BaseModel

from shared.agents import Agent, AgentRegistry
from shared.errors import ConfigError
from shared.pipeline.definition import Pipeline
from shared.pipeline.types import accepts
from shared.pipeline.values import as_input, jsonable, value_of


class Parts(BaseModel):
    items: list[str]


class Draft(BaseModel):
    text: str


class Other(BaseModel):
    n: int


def registry() -> AgentRegistry:
    r = AgentRegistry()
    r.add(Agent(name="split", model="scripted:x", system_prompt=".", output_type=Parts))
    r.add(Agent(name="draft", model="scripted:x", system_prompt=".", output_type=Draft))
    r.add(Agent(name="text", model="scripted:x", system_prompt="."))
    return r


def parts_items(parts: Parts) -> list[str]:
    return parts.items


def draft_text(draft: Draft) -> str:
    return draft.text


def draft_lines(draft: Draft) -> list[str]:
    return draft.text.splitlines()


def other_text(other: Other) -> str:
    return str(other.n)


def texts(answers: list[str]) -> str:
    return "\n".join(answers)


def drafts(values: list[Draft]) -> str:
    return "\n".join(d.text for d in values)


def test_a_well_typed_pipeline_registers() -> None:
    r = registry()
    p = r.add_pipeline(
        Pipeline("ok").then("split").map("draft", over=parts_items).reduce("text", input=drafts).then("text")
    )
    assert [s.name for s in p.steps] == ["split", "draft", "text", "text-2"]
    assert r.pipeline_names == ["ok"]
    assert r.pipeline("ok") is p


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        (Pipeline("p").then("nobody"), "step 'nobody': unknown agent 'nobody'"),
        (Pipeline("p").then("draft").then("text", input=other_text), "input() takes Other but gets Draft"),
        (Pipeline("p").then("split").map("text", over=draft_lines), "over() takes Draft but gets Parts"),
        (
            Pipeline("p").then("split").map("text", over=parts_items, input=draft_text),
            "takes Draft but gets str",
        ),
        (
            Pipeline("p").then("split").map("text", over=parts_items).reduce("text", input=drafts),
            "input() takes list[Draft] but gets list[str]",
        ),
        (
            Pipeline("p").then("draft").then("text", expects=Parts),
            "expects Parts but the step before hands on Draft",
        ),
        (Pipeline("p", input_type=Draft).then("text", input=other_text), "takes Other but gets Draft"),
        (Pipeline("p"), "has no steps"),
    ],
)
def test_mismatches_are_refused_at_registration(pipeline: Pipeline, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        registry().add_pipeline(pipeline)


def test_steps_that_cannot_be_built() -> None:
    with pytest.raises(ConfigError, match="must follow a map step"):
        Pipeline("p").then("text").reduce("text")
    with pytest.raises(ConfigError, match="a branch is the last step"):
        Pipeline("p").branch(lambda v: "a", {"a": "text"}).then("text")
    with pytest.raises(ConfigError, match="retries must be in"):
        Pipeline("p").then("text", retries=9)
    with pytest.raises(ConfigError, match="concurrency must be in"):
        Pipeline("p").map("text", over=list, concurrency=0)
    with pytest.raises(ConfigError, match="alphanumeric"):
        Pipeline("bad name")


def test_branches_check_their_cases_and_refuse_cycles() -> None:
    r = registry()
    r.add_pipeline(Pipeline("takes-draft", input_type=Draft).then("text", input=draft_text))
    r.add_pipeline(Pipeline("takes-text").then("text"))

    def pick(draft: Draft) -> str:
        return "a"

    r.add_pipeline(Pipeline("ok").then("draft").branch(pick, {"a": "takes-draft", "b": "text"}))
    assert [s.agent for s in r.steps_of("text")] == ["text"]  # an agent case: one run of it
    with pytest.raises(ConfigError, match="goes to pipeline 'takes-text', which takes str, with Draft"):
        r.add_pipeline(Pipeline("p1").then("draft").branch(pick, {"a": "takes-text"}))
    with pytest.raises(ConfigError, match="goes back to pipeline 'loop': a cycle"):
        r.add_pipeline(Pipeline("loop").then("draft").branch(pick, {"a": "loop"}))
    with pytest.raises(ConfigError, match="neither an agent nor a pipeline registered before"):
        r.add_pipeline(Pipeline("p2").then("draft").branch(pick, {"a": "later"}))
    with pytest.raises(ConfigError, match="choose\\(\\) takes Draft but gets str"):
        r.add_pipeline(Pipeline("p3").then("text").branch(pick, {"a": "text"}))
    with pytest.raises(ConfigError, match="registered twice"):
        r.add_pipeline(Pipeline("ok").then("text"))


def test_unannotated_functions_accept_anything() -> None:
    registry().add_pipeline(Pipeline("p").then("draft").then("text", input=lambda d: d.text))


@pytest.mark.parametrize(
    ("expected", "actual", "fits"),
    [
        (str, str, True),
        (BaseModel, Draft, True),
        (Draft, BaseModel, False),
        (list[Draft], list[Draft], True),
        (list, list[str], True),
        (list[str], str, False),
        (Draft | None, Draft, True),
        (Any, Draft, True),
        (str, Any, True),
    ],
)
def test_accepts(expected: Any, actual: Any, fits: bool) -> None:
    assert accepts(expected, actual) is fits


def test_values() -> None:
    assert as_input("plain") == "plain"
    assert as_input(Draft(text="x")) == '{"text": "x"}'
    assert as_input([Draft(text="x"), "y"]) == '[{"text": "x"}, "y"]'
    assert jsonable([Draft(text="x")]) == [{"text": "x"}]
    assert value_of({"answer": "a", "output": {"text": "t"}}, Draft) == Draft(text="t")
    assert value_of({"answer": "a", "output": None}, None) == "a"


class Notes(BaseModel):
    notes: list[str] = []


class MoreNotes(Notes):
    more: int = 0


def test_state_handed_along_needs_one_run_before_and_fitting_state_types() -> None:
    r = registry()
    r.add(Agent(name="noter", model="scripted:x", system_prompt=".", state_type=Notes))
    r.add(Agent(name="more", model="scripted:x", system_prompt=".", state_type=MoreNotes))
    r.add_pipeline(
        Pipeline("ok").then("more").then("noter", state=True).map("noter", over=text_lines, state=True)
    )
    refused = [
        (
            Pipeline("first").then("noter", state=True),
            "needs a then or reduce step (one run) right before it",
        ),
        (
            Pipeline("after-map")
            .then("split")
            .map("noter", over=parts_items)
            .then("noter", input=texts, state=True),
            "needs a then or reduce step (one run) right before it",
        ),
        (
            Pipeline("stateless").then("text").then("noter", state=True),
            "needs both agents to declare a state_type",
        ),
        (Pipeline("narrower").then("noter").then("more", state=True), "state is a Notes, not the MoreNotes"),
    ]
    for pipeline, message in refused:
        with pytest.raises(ConfigError, match=re.escape(message)):
            r.add_pipeline(pipeline)


def text_lines(text: str) -> list[str]:
    return text.splitlines()
