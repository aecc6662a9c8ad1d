"""Structured output (parsing, the request's format, the reprompt) and prompt templates, in process."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field

from shared.agents import Agent
from shared.errors import ConfigError, InvalidModelAction, InvalidRequest
from shared.llm.base import ModelRequest
from shared.llm.ollama import OllamaAdapter
from shared.llm.openai import OpenAIAdapter
from shared.llm.scripted import ScriptedModel, reply
from shared.messages import Message, SystemMessage, UserMessage
from shared.output import output_format, parse_output
from shared.prompts import Prompt
from shared.state import RunHead
from shared.tools import ToolSet, tool
from worker.start import render_prompts
from worker.think import build_request, correction_for


class Answer(BaseModel):
    city: str
    population: int = Field(ge=0)


class AddArgs(BaseModel):
    a: float
    b: float


@tool
def add(args: AddArgs) -> float:
    """Add two numbers."""
    return args.a + args.b


def _agent(**kwargs: object) -> Agent:
    fields: dict[str, object] = {
        "name": "a",
        "model": "scripted:x",
        "system_prompt": "base prompt",
        "tools": ToolSet([add]),
        **kwargs,
    }
    return Agent(**fields)  # type: ignore[arg-type]


CONVERSATION: list[Message] = [SystemMessage(content="base prompt"), UserMessage(content="hi")]


# -- parsing ----------------------------------------------------------------------------------------


def test_a_valid_answer_is_parsed_to_json_data() -> None:
    assert parse_output('{"city": "Lyon", "population": 5}', Answer, 1) == {"city": "Lyon", "population": 5}


def test_a_fenced_answer_is_accepted() -> None:
    text = 'Here:\n```json\n{"city": "Lyon", "population": 5}\n```'
    with pytest.raises(InvalidModelAction):  # text around the fence is not one object
        parse_output(text, Answer, 1)
    fenced = '```json\n{"city": "Lyon", "population": 5}\n```'
    assert parse_output(fenced, Answer, 1)["city"] == "Lyon"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("Lyon, 5", "it is not a JSON object"),
        (None, "it is not a JSON object"),
        ('{"city": "Lyon", "population": -1}', "population: Input should be greater than or equal to 0"),
        ('{"city": "Lyon"}', "population: Field required"),
    ],
)
def test_an_invalid_answer_says_why(text: str | None, problem: str) -> None:
    with pytest.raises(InvalidModelAction) as caught:
        parse_output(text, Answer, 3)
    assert caught.value.message == f"the final answer does not match the output type Answer: {problem}"
    assert caught.value.step == 3


# -- the request ------------------------------------------------------------------------------------


def test_a_provider_without_a_schema_mode_is_told_in_the_system_prompt() -> None:
    agent = _agent(output_type=Answer)
    request = build_request(agent, ScriptedModel([reply("x")]), "scripted:x", CONVERSATION)
    assert request.output is None
    system = request.messages[0]
    assert isinstance(system, SystemMessage) and system.content.startswith("base prompt\n\n")
    assert output_format(Answer).schema_text() in system.content
    assert CONVERSATION[0].content == "base prompt"  # the stored conversation is left alone


def test_a_provider_with_a_schema_mode_gets_the_schema_on_the_request() -> None:
    agent = _agent(output_type=Answer)
    adapter = OpenAIAdapter("gpt-4o", api_key="sk-test")
    request = build_request(agent, adapter, "openai:gpt-4o", CONVERSATION)
    assert request.output == output_format(Answer)
    assert request.messages == CONVERSATION
    body = adapter.body(request, stream=False)
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Answer", "schema": Answer.model_json_schema(), "strict": False},
    }
    ollama = OllamaAdapter("llama3", host="http://127.0.0.1:1")
    assert ollama.body(request, stream=False)["format"] == Answer.model_json_schema()


def test_without_an_output_type_nothing_changes() -> None:
    request = build_request(_agent(), ScriptedModel([reply("x")]), "scripted:x", CONVERSATION)
    assert request == ModelRequest(model="x", messages=CONVERSATION, tools=ToolSet([add]).specs())
    assert "response_format" not in OpenAIAdapter("m", api_key="k").body(request, stream=False)


def test_the_reprompt_shows_the_tool_schema_and_the_output_schema() -> None:
    agent = _agent(output_type=Answer)
    bad_args = InvalidModelAction("arguments for 'add' failed validation: b: Field required", tool="add")
    told = correction_for(agent, bad_args)
    assert json.dumps(AddArgs.model_json_schema(), sort_keys=True) in told
    assert output_format(Answer).schema_text() in told
    plain = correction_for(_agent(), InvalidModelAction("the model returned neither text nor tool calls"))
    assert "JSON schema" not in plain


def test_an_output_type_must_be_a_model_of_an_object() -> None:
    with pytest.raises(ConfigError, match="pydantic BaseModel class"):
        _agent(output_type=dict)


# -- templates --------------------------------------------------------------------------------------


def _head(input: str, metadata: dict[str, object]) -> RunHead:
    return RunHead.new_idle("r1", "a", input, metadata=dict(metadata))


def test_templates_fill_input_and_metadata() -> None:
    agent = _agent(system_prompt=Prompt("Speak {lang}. {{literal}}"), input_template=Prompt("Q{n}: {input}"))
    assert agent.variables == frozenset({"lang", "n"})
    system, user = render_prompts(agent, _head("why?", {"lang": "Basque", "n": 3}))
    assert (system, user) == ("Speak Basque. {literal}", "Q3: why?")


def test_plain_prompts_keep_their_braces() -> None:
    agent = _agent(system_prompt='Answer like {"a": 1}')
    assert agent.variables == frozenset()
    assert render_prompts(agent, _head("x", {})) == ('Answer like {"a": 1}', "x")


def test_a_missing_variable_is_an_invalid_request() -> None:
    agent = _agent(system_prompt=Prompt("Speak {lang}."))
    with pytest.raises(InvalidRequest, match="the prompt needs metadata 'lang'"):
        render_prompts(agent, _head("x", {"other": 1}))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("Hi {name", "malformed"),
        ("Hi {user.name}", "plain name"),
        ("Hi {0}", "plain name"),
        ("Hi {name!r}", "no format spec or conversion"),
        ("Hi {name:>10}", "no format spec or conversion"),
    ],
)
def test_a_malformed_template_fails_at_registration(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        Prompt(text)
