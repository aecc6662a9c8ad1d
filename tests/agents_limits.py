"""Agents of the provider-limit tests: a real OpenAI adapter (pointed at a loopback fake) and a tool."""

from __future__ import annotations

from shared.agents import Agent, AgentRegistry
from shared.limits import ProviderLimit
from shared.llm.scripted import ScriptedModel, reply
from shared.tools import ToolSet
from tests.agents_fixture import add

MODEL = "openai:fake-model"
registry = AgentRegistry()
#: One tool hop: two model calls per run.
registry.add(
    Agent(name="limited", model=MODEL, system_prompt="add numbers", tools=ToolSet([add]), stream=False)
)
#: The same, streaming, with its limit declared on the agent instead of in the settings.
registry.add(
    Agent(
        name="limited_by_agent",
        model="openai:agent-model",
        system_prompt="add numbers",
        tools=ToolSet([add]),
        limits=ProviderLimit(concurrency=2),
    )
)
#: Answers at once without a provider: the case agent of an eval whose judge is the limited model.
registry.add_model("instant", ScriptedModel([reply("3")] * 10_000))
registry.add(Agent(name="instant", model="scripted:instant", system_prompt="answer", tools=ToolSet([])))
