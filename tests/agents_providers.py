"""Agents backed by real provider adapters, for the integration tests of ``test_providers.py``.

Every model here is a real ``PROVIDER:MODEL`` string: the worker builds the provider's adapter
from its own environment (``OPENAI_BASE_URL``, ``OLLAMA_HOST``, ``ANTHROPIC_BASE_URL`` and the
keys), which the tests point at loopback fakes. The tools come from ``tests.agents_fixture``.
"""

from __future__ import annotations

from pydantic import BaseModel

from shared.agents import Agent, AgentRegistry
from shared.policy import Policy, Reprompt, Retry
from shared.tools import ToolSet, tool
from tests.agents_fixture import add

#: The model of each provider's agents (the Ollama one has a tag: only the first colon splits).
MODELS = {
    "openai": "openai:fake-model",
    "ollama": "ollama:fake-model:latest",
    "anthropic": "anthropic:fake-model",
}
PROVIDERS = tuple(MODELS)


class NoteArgs(BaseModel):
    text: str


@tool
def note(args: NoteArgs) -> str:
    """Write a note down and read it back."""
    return args.text


class Forecast(BaseModel):
    """The structured answer of the ``*_structured`` agents."""

    city: str
    celsius: float


TOOLS = ToolSet([add])
registry = AgentRegistry()


def _agent(name: str, model: str, **kwargs: object) -> None:
    kwargs.setdefault("tools", TOOLS)
    registry.add(
        Agent(name=name, model=model, system_prompt=f"provider test agent {name}", **kwargs)  # type: ignore[arg-type]
    )


for _provider, _model in MODELS.items():
    # The default policy: on_model_error=Retry(n=2), on_invalid_action=Fail().
    _agent(f"{_provider}_stream", _model, stream=True)
    _agent(f"{_provider}_complete", _model, stream=False)
    _agent(f"{_provider}_retry_once", _model, stream=True, policy=Policy(on_model_error=Retry(n=1)))
    # A tool taking text, for answers and arguments whose characters arrive cut.
    _agent(f"{_provider}_notes", _model, stream=True, tools=ToolSet([note]))
    # A final answer in the shape of Forecast: native JSON schema where the provider has one.
    _agent(
        f"{_provider}_structured",
        _model,
        stream=True,
        output_type=Forecast,
        policy=Policy(on_invalid_action=Reprompt(n=1)),
    )

_agent("openai_reprompt", MODELS["openai"], stream=False, policy=Policy(on_invalid_action=Reprompt(n=1)))
_agent("react", "react+openai:fake-model", stream=True)
_agent("react_complete", "react+openai:fake-model", stream=False)
