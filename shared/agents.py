"""Named agent specs, registered in a module that workers and the CLI import by path.

An agents module exposes a module-level ``registry``::

    registry = AgentRegistry()
    registry.add(Agent(name="helper", model="openai:gpt-4o-mini", system_prompt="...", tools=ToolSet([...])))
    registry.add_model("fixed", ScriptedModel([...]))   # then usable as model="scripted:fixed"
    registry.add_pipeline(Pipeline("review").then("drafter").then("reviewer"))  # shared/pipeline/
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType

from pydantic import BaseModel

from shared.configurable import Configurable
from shared.context import ContextBudget
from shared.errors import ConfigError
from shared.handoffs import MAX_HANDOFFS_CEILING, Handoff, normalised
from shared.limits import ProviderLimit
from shared.llm.base import LlmAdapter, OutputFormat
from shared.messages import ToolCall
from shared.middleware import Middleware
from shared.output import MAX_SCHEMA_CHARS, output_format
from shared.pipeline.definition import Pipeline, Step
from shared.policy import Policy
from shared.prompts import INPUT_VARIABLE, Prompt
from shared.state import DEFAULT_THREAD_POLICY, THREAD_POLICIES, ThreadPolicy
from shared.tools import RISKS, Risk, ToolSet
from shared.versions import MigrateFn, VersionPolicy

__all__ = ["Agent", "AgentRegistry", "load_registry"]


@dataclass(frozen=True)
class Agent:
    """A named agent spec: its model, system prompt, tools, policy, step budget and approvals."""

    name: str
    #: ``PROVIDER:MODEL``: ``scripted:NAME`` (a model registered beside the agent, or a JSON file path),
    #: ``openai:…``, ``ollama:…``, ``anthropic:…``; prefix ``react+`` for text-only ReAct models.
    model: str
    #: Plain text, or a :class:`Prompt` template filled from the run's input and metadata.
    system_prompt: str | Prompt
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
    #: The shape of the final answer (``shared/output.py``): validated, stored on the run as
    #: ``output``; None: a free-text answer.
    output_type: type[BaseModel] | None = None
    #: The run's custom state (``shared/run_state.py``): its tools read and update it, it is
    #: checkpointed with every commit; None: no state.
    state_type: type[BaseModel] | None = None
    #: How the run's input becomes the user message (``{input}`` and metadata variables); None:
    #: the input as it is.
    input_template: Prompt | None = None
    #: Hooks around the input, the model calls and the tool calls, in order (``shared/middleware.py``).
    middleware: tuple[Middleware, ...] = ()
    #: Calls of tools at or above this risk need a human's approval (None: risk alone never does).
    approval_risk: Risk | None = None
    #: How deep subagent runs may nest below a run of this agent (``AgentTool``).
    max_subagent_depth: int = 3
    #: Subagent runs one run of this agent may start, in total.
    max_children: int = 20
    #: At most this many tool calls of one step run at once (1: one after another), the rest in
    #: later waves of the same step; None: all at once.
    max_parallel_tools: int | None = None
    #: The prompt-token budget of its model requests, and how to stay under it (``shared/context.py``);
    #: None: the whole conversation is sent.
    context: ContextBudget | None = None
    #: Agents this one may hand the conversation to (``shared/handoffs.py``), as :class:`Handoff`
    #: values or plain agent names: the model sees one ``transfer_to_<agent>`` tool per target.
    handoffs: tuple[Handoff | str, ...] = ()
    #: Handoffs a run may have had when this agent's model asks for one more (a cycle counts too).
    max_handoffs: int = 5
    #: Older versions whose runs this code serves as they are (``shared/versions.py``): a worker of
    #: this version takes their phases too, and re-pins them to this version.
    compatible_versions: tuple[str, ...] = ()
    #: Older versions whose runs this code takes over through a migration of their custom state
    #: (version -> function; ``shared/versions.py``), applied once at their next model phase.
    migrate_from: Mapping[str, MigrateFn] | None = None
    #: What a run of this agent does when another run of its thread has not ended, unless its
    #: request chooses (``docs/agents.md``, "Threads and a second message").
    thread_policy: ThreadPolicy = DEFAULT_THREAD_POLICY
    #: A message sent into a run parked for a human's approval of tool calls wakes it: the calls
    #: are denied (not run) and the model thinks again with the message (``shared/signals.py``).
    #: False: the message waits for the decision.
    wake_on_message: bool = False
    #: What assistants may configure of this agent (``shared/assistants.py``); None: no assistant
    #: can name it.
    configurable: Configurable | None = None

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
        self._check_output_type()
        self._check_runtime_features()
        if self.state_type is not None and not (
            isinstance(self.state_type, type) and issubclass(self.state_type, BaseModel)
        ):
            raise ConfigError(f"agent {self.name!r}: state_type must be a pydantic BaseModel class")
        if not isinstance(self.middleware, tuple) or not all(
            isinstance(m, Middleware) for m in self.middleware
        ):
            raise ConfigError(f"agent {self.name!r}: middleware must be a tuple of Middleware instances")
        if self.max_parallel_tools is not None and not 1 <= self.max_parallel_tools <= 100:
            raise ConfigError(f"agent {self.name!r}: max_parallel_tools must be in 1..100 (or None)")
        if not 0 <= self.max_subagent_depth <= 10 or not 0 <= self.max_children <= 1000:
            raise ConfigError(f"agent {self.name!r}: max_subagent_depth in 0..10, max_children in 0..1000")
        if self.approval_risk is not None and self.approval_risk not in RISKS:
            raise ConfigError(f"agent {self.name!r}: approval_risk must be one of {', '.join(RISKS)}")

    def _check_runtime_features(self) -> None:
        """Versions, thread policy, handoffs and what assistants may configure."""
        if not isinstance(self.compatible_versions, tuple):
            raise ConfigError(f"agent {self.name!r}: compatible_versions must be a tuple")
        self.versions.check()
        if self.thread_policy not in THREAD_POLICIES:
            choices = ", ".join(THREAD_POLICIES)
            raise ConfigError(f"agent {self.name!r}: thread_policy must be one of {choices}")
        self._check_handoffs()
        if self.configurable is not None:
            if not isinstance(self.configurable, Configurable):
                raise ConfigError(f"agent {self.name!r}: configurable must be a Configurable")
            self.configurable.check(self.name)

    def _check_handoffs(self) -> None:
        if not isinstance(self.handoffs, tuple | list):
            raise ConfigError(f"agent {self.name!r}: handoffs must be a tuple of Handoff values or names")
        # Stored as Handoff values, whatever was declared (a frozen dataclass: set once, here).
        object.__setattr__(self, "handoffs", normalised(self.name, self.handoffs))
        if not 0 <= self.max_handoffs <= MAX_HANDOFFS_CEILING:
            raise ConfigError(f"agent {self.name!r}: max_handoffs must be in 0..{MAX_HANDOFFS_CEILING}")
        clash = {h.name for h in self.handoff_targets} & set(self.tools.names)
        if clash:
            raise ConfigError(f"agent {self.name!r}: handoff tools {sorted(clash)} clash with its tools")

    @property
    def handoff_targets(self) -> tuple[Handoff, ...]:
        """The declared handoffs, each as a :class:`Handoff`."""
        return tuple(h for h in self.handoffs if isinstance(h, Handoff))

    def needs_approval(self, call: ToolCall) -> bool:
        """Whether a human must approve ``call`` (validated) before it runs: the tool is listed in
        ``approval_required``, is at or above ``approval_risk``, or its own predicate says so."""
        tool = self.tools.get(call.name)
        if tool is not None and tool.subagent is not None:
            return False  # a subagent runs as its own run, whose tools carry their own approvals
        if call.name in self.approval_required:
            return True
        if tool is None:
            return False
        if self.approval_risk is not None and RISKS.index(tool.risk) >= RISKS.index(self.approval_risk):
            return True
        return tool.approval is not None and bool(tool.approval(tool.validate(call.arguments)))

    def _check_output_type(self) -> None:
        if self.output_type is None:
            return
        if not (isinstance(self.output_type, type) and issubclass(self.output_type, BaseModel)):
            raise ConfigError(f"agent {self.name!r}: output_type must be a pydantic BaseModel class")
        fmt = output_format(self.output_type)
        if len(fmt.schema_text()) > MAX_SCHEMA_CHARS:
            raise ConfigError(
                f"agent {self.name!r}: output_type's JSON schema is over {MAX_SCHEMA_CHARS} characters"
            )
        if fmt.schema_.get("type") != "object":
            raise ConfigError(f"agent {self.name!r}: output_type's JSON schema must be an object")

    @property
    def versions(self) -> VersionPolicy:
        """Which runs this code serves: its own version's, and the older ones it opts in to."""
        return VersionPolicy(self.name, self.version, self.compatible_versions, self.migrate_from)

    @property
    def output(self) -> OutputFormat | None:
        """The final answer's format, or None for free text."""
        return output_format(self.output_type) if self.output_type is not None else None

    @property
    def variables(self) -> frozenset[str]:
        """The metadata keys the agent's templates need (``input`` is the run's input, always there)."""
        names: set[str] = set()
        for template in (self.system_prompt, self.input_template):
            if isinstance(template, Prompt):
                names |= template.variables
        return frozenset(names - {INPUT_VARIABLE})


class AgentRegistry:
    """The agents (and in-process models) an agents module offers, by name."""

    def __init__(self) -> None:
        self._agents: dict[str, Agent] = {}
        self._models: dict[str, LlmAdapter] = {}
        self._pipelines: dict[str, Pipeline] = {}

    def add(self, agent: Agent) -> Agent:
        if agent.name in self._agents:
            raise ConfigError(f"agent {agent.name!r} is registered twice")
        self._agents[agent.name] = agent
        return agent

    def add_pipeline(self, pipeline: Pipeline) -> Pipeline:
        """Register a pipeline of runs, checked against the agents (``shared/pipeline/check.py``):
        register its agents, and the pipelines its branches go to, first."""
        if pipeline.name in self._pipelines:
            raise ConfigError(f"pipeline {pipeline.name!r} is registered twice")
        # Loaded by the first pipeline an agents module registers, when its registry loads (before
        # a worker forks): the worker of agents modules that register none never needs the check.
        from shared.pipeline.check import check_pipeline

        check_pipeline(pipeline, self.get, self._pipelines)
        self._pipelines[pipeline.name] = pipeline
        return pipeline

    def pipeline(self, name: str) -> Pipeline:
        try:
            return self._pipelines[name]
        except KeyError:
            known = ", ".join(sorted(self._pipelines)) or "none"
            raise ConfigError(f"unknown pipeline {name!r} (registered: {known})") from None

    def steps_of(self, target: str) -> tuple[Step, ...]:
        """The steps a pipeline run goes through at ``target``: a pipeline's, or one run of an agent
        (a branch's case may name either)."""
        if target in self._pipelines:
            return self._pipelines[target].steps
        self.get(target)
        return (Step("then", target, target),)

    @property
    def pipeline_names(self) -> list[str]:
        return sorted(self._pipelines)

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
    """Import ``module_path`` and return its ``registry`` (cached per process).

    ``module_path`` is a module's dotted name, found on ``sys.path`` or else in the working
    directory (as ``celery -A`` finds its app), or the path of a ``.py`` file (``./myagents.py``,
    ``path/to/agents.py``).
    """
    try:
        module = _import_agents(module_path)
    except ImportError as exc:
        raise ConfigError(f"cannot import agents module {module_path!r}: {exc}") from exc
    registry = getattr(module, "registry", None)
    if not isinstance(registry, AgentRegistry):
        raise ConfigError(f"agents module {module_path!r} has no module-level `registry = AgentRegistry()`")
    return registry


def _import_agents(module_path: str) -> ModuleType:
    if module_path.endswith(".py") or "/" in module_path or os.sep in module_path:
        return _import_file(Path(module_path))
    # A console script's sys.path starts with its own directory, not the working directory: the
    # user's `--agents myagents` in the directory that holds it would not be found. Appended, not
    # prepended, so a file there never shadows an installed package (a user's mcp.py, say). Prefork
    # children inherit the path with the rest of the process.
    _on_path(os.getcwd())
    return importlib.import_module(module_path)


def _import_file(path: Path) -> ModuleType:
    """An agents module given by its file, imported under its file's stem (its directory goes on
    the path, so the modules beside it import as they would from there)."""
    path = path.resolve()
    if not path.is_file():
        raise ImportError(f"no such file: {path}")
    _on_path(str(path.parent))
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", None) or "").resolve() == path:
            return loaded
        raise ImportError(f"another module named {name!r} is already imported ({loaded.__file__})")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs, as an import would: pydantic models and dataclasses in it look
    # their module up by name.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _on_path(directory: str) -> None:
    if directory not in sys.path:
        sys.path.append(directory)
