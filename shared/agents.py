"""Named agent specs, registered in a module that workers and the CLI import by path.

An agents module exposes a module-level ``registry``::

    registry = AgentRegistry()
    registry.add(Agent(name="helper", model="openai:gpt-4o-mini", system_prompt="...", tools=ToolSet([...])))
    registry.add_model("fixed", ScriptedModel([...]))   # then usable as model="scripted:fixed"
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import cache

from shared.errors import ConfigError
from shared.limits import ProviderLimit
from shared.llm.base import LlmAdapter
from shared.policy import Policy
from shared.tools import ToolSet

__all__ = ["Agent", "AgentRegistry", "load_registry"]


@dataclass(frozen=True)
class Agent:
    """A named agent spec: its model, system prompt, tools, policy, step budget and approvals."""

    name: str
    #: ``PROVIDER:MODEL``: ``scripted:NAME`` (a model registered beside the agent, or a JSON file path),
    #: ``openai:…``, ``ollama:…``, ``anthropic:…``; prefix ``react+`` for text-only ReAct models.
    model: str
    system_prompt: str
    tools: ToolSet = field(default_factory=ToolSet)
    policy: Policy = field(default_factory=Policy)
    max_steps: int = 10
    version: str = "1"
    #: Stream the model's answer as TokenDelta events.
    stream: bool = True
    #: Tools whose calls a human must approve first (the run parks in AWAITING_APPROVAL).
    approval_required: frozenset[str] = frozenset()
    #: The provider limit of this agent's model, shared by the pool, when the workers' settings
    #: (``WESICHAIN_PROVIDER_LIMITS``) name none for it (see ``shared/limits.py``).
    limits: ProviderLimit | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ConfigError(f"agent name {self.name!r} must be alphanumeric (with - _ .)")
        if not 1 <= self.max_steps <= 1000:
            raise ConfigError(f"agent {self.name!r}: max_steps must be in 1..1000")
        unknown = set(self.approval_required) - set(self.tools.names)
        if unknown:
            raise ConfigError(f"agent {self.name!r}: approval_required names unknown tools {sorted(unknown)}")
        if ":" not in self.model:
            raise ConfigError(f"agent {self.name!r}: model {self.model!r} must look like PROVIDER:MODEL")


class AgentRegistry:
    """The agents (and in-process models) an agents module offers, by name."""

    def __init__(self) -> None:
        self._agents: dict[str, Agent] = {}
        self._models: dict[str, LlmAdapter] = {}

    def add(self, agent: Agent) -> Agent:
        if agent.name in self._agents:
            raise ConfigError(f"agent {agent.name!r} is registered twice")
        self._agents[agent.name] = agent
        return agent

    def add_model(self, name: str, adapter: LlmAdapter) -> None:
        """Register an in-process model (typically a ScriptedModel) as ``scripted:NAME``."""
        if name in self._models:
            raise ConfigError(f"model {name!r} is registered twice")
        self._models[name] = adapter

    def remove_model(self, name: str) -> None:
        """Forget an in-process model (a test's scripted model, after the test)."""
        self._models.pop(name, None)

    def get(self, name: str) -> Agent:
        try:
            return self._agents[name]
        except KeyError:
            known = ", ".join(sorted(self._agents)) or "none"
            raise ConfigError(f"unknown agent {name!r} (registered: {known})") from None

    def model(self, name: str) -> LlmAdapter | None:
        return self._models.get(name)

    @property
    def names(self) -> list[str]:
        return sorted(self._agents)


@cache
def load_registry(module_path: str) -> AgentRegistry:
    """Import ``module_path`` and return its ``registry`` (cached per process)."""
    try:
        module = importlib.import_module(module_path)
    except ImportError as exc:
        raise ConfigError(f"cannot import agents module {module_path!r}: {exc}") from exc
    registry = getattr(module, "registry", None)
    if not isinstance(registry, AgentRegistry):
        raise ConfigError(f"agents module {module_path!r} has no module-level `registry = AgentRegistry()`")
    return registry
