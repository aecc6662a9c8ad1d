"""Assistants: named, versioned configurations of a code-defined agent, changed without a deploy.

The agent's author declares what may be configured (:class:`~shared.configurable.Configurable`,
with the rest of what every run needs, in ``shared/configurable.py``); an assistant is a name, the
agent it configures and an :class:`AssistantConfig` of only those fields, each change a new
immutable version (``shared/assistant_store.py`` keeps them). A run that names an assistant is
pinned to one version when it is created, and every phase of it builds its agent with that
version's configuration (:func:`apply_config`).

Three things happen to a configuration, each in one place here:

- :func:`check_config` validates it against a :class:`~shared.configurable.ConfigSchema`: the one
  a worker derives from its agent (:func:`~shared.configurable.schema_of`) and advertises in the
  worker registry, so the HTTP API checks an assistant with no agent code at hand, and the worker
  checks it again when a run starts;
- :func:`apply_config` derives the run's :class:`~shared.agents.Agent` from the registered one;
- :func:`diff_configs` compares two versions field by field.

The model an assistant names is not applied to the agent: the start phase sets it as the run's
model, like a per-run ``model`` (an untrusted string, never the author's own).
"""

from __future__ import annotations

import dataclasses
import json
import string
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# What an agent and a worker need on every run is apart, in shared.configurable: a worker loads this
# module with the first run that names an assistant. An agents module may import Configurable from
# here, as before the split.
from shared.configurable import POLICY_CHOICES, ConfigSchema
from shared.configurable import Configurable as Configurable
from shared.errors import ConfigError, InvalidRequest, PolicyConfigInvalid
from shared.prompts import MAX_VALUE_CHARS, Prompt
from shared.tools import ToolSet

if TYPE_CHECKING:
    from shared.agents import Agent

__all__ = [
    "AssistantConfig",
    "AssistantConflict",
    "AssistantExists",
    "AssistantInvalid",
    "AssistantVersion",
    "FieldChange",
    "MAX_CONFIG_CHARS",
    "MAX_PROMPT_CHARS",
    "MAX_TEMPLATE_VALUES",
    "MAX_TOOLS",
    "UnknownAssistant",
    "apply_config",
    "check_config",
    "diff_configs",
    "prefill",
]

#: The longest system prompt an assistant may set.
MAX_PROMPT_CHARS = 20_000
#: The longest a whole configuration may be, as JSON (it is read by every phase of its runs).
MAX_CONFIG_CHARS = 32_000
#: The most template values and tools one configuration may name.
MAX_TEMPLATE_VALUES = 32
MAX_TOOLS = 128


class AssistantInvalid(InvalidRequest):
    """A configuration the agent does not allow: ``field`` says which of its fields."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field=field)
        self.field = field


class UnknownAssistant(InvalidRequest):
    """No assistant (or no version of it) by that name, for this tenant."""


class AssistantExists(InvalidRequest):
    """An assistant of that name exists already (create), for this tenant."""


class AssistantConflict(InvalidRequest):
    """An update said which version it changes (``if_version``) and the assistant has moved on."""


class AssistantConfig(BaseModel):
    """One version's configuration: only the fields it sets change the agent (null: the agent's own)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(
        default=None, min_length=3, max_length=200, pattern=":", description="PROVIDER:MODEL."
    )
    system_prompt: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PROMPT_CHARS,
        description="Replaces the agent's system prompt: a template ({input}, metadata keys and the"
        " template values; {{ and }} for braces).",
    )
    template_values: dict[str, str] | None = Field(
        default=None,
        max_length=MAX_TEMPLATE_VALUES,
        description="Values of the agent's template variables (they win over the run's metadata).",
    )
    tools: list[str] | None = Field(
        default=None, max_length=MAX_TOOLS, description="The subset of the agent's tools offered."
    )
    max_steps: int | None = Field(default=None, ge=1, le=1000)
    policy: dict[str, str] | None = Field(
        default=None, max_length=len(POLICY_CHOICES), description="Policy fields: on_tool_error..."
    )

    @classmethod
    def parse(cls, raw: Any) -> AssistantConfig:
        """A configuration from a producer's JSON, or :class:`AssistantInvalid` naming the field."""
        if isinstance(raw, AssistantConfig):
            config = raw
        else:
            if not isinstance(raw, Mapping):
                raise AssistantInvalid("config", f"config must be a JSON object, got {type(raw).__name__}")
            try:
                config = cls.model_validate(dict(raw))
            except ValidationError as exc:
                first = exc.errors()[0]
                field = str(first["loc"][0]) if first["loc"] else "config"
                loc = ".".join(str(p) for p in first["loc"]) or "config"
                if first["type"] == "extra_forbidden":
                    raise AssistantInvalid(field, f"config field {field!r} does not exist") from None
                raise AssistantInvalid(field, f"config {loc}: {first['msg']}") from None
        size = len(config.model_dump_json(exclude_none=True))
        if size > MAX_CONFIG_CHARS:
            raise AssistantInvalid(
                "config", f"config is {size} chars of JSON; the limit is {MAX_CONFIG_CHARS}"
            )
        for name, value in (config.template_values or {}).items():
            if len(value) > MAX_VALUE_CHARS:
                raise AssistantInvalid(
                    "template_values", f"template value {name[:80]!r} is over {MAX_VALUE_CHARS} chars"
                )
        return config

    def fields_set(self) -> dict[str, Any]:
        """The fields this configuration sets, as JSON values."""
        dumped: dict[str, Any] = self.model_dump(mode="json", exclude_none=True)
        return dumped


class AssistantVersion(BaseModel):
    """One immutable version of an assistant, as stored and shown."""

    name: str
    agent: str
    version: int = Field(description="1, 2, ...: every change is a new version; the newest is current.")
    config: AssistantConfig
    created_at: float
    #: Set by a rollback: the version whose configuration this one restored.
    restored_from: int | None = None


class FieldChange(BaseModel):
    """One field that differs between two versions (``None``: not set, the agent's own)."""

    field: str
    before: Any = None
    after: Any = None
    change: Literal["added", "removed", "changed"]


def check_config(agent: str, config: AssistantConfig, schema: ConfigSchema | None) -> None:
    """Refuse a configuration ``agent``'s schema does not allow, naming the first field at fault."""
    if schema is None:
        raise AssistantInvalid("agent", f"agent {agent!r} declares nothing an assistant may configure")
    for field, check in _CHECKS:
        if getattr(config, field) is not None:
            why = check(config, schema)
            if why is not None:
                raise AssistantInvalid(field, f"agent {agent!r}: {field}: {why}")


def _model_allowed(config: AssistantConfig, schema: ConfigSchema) -> str | None:
    assert config.model is not None
    if schema.model is False:
        return "not configurable"
    if isinstance(schema.model, list) and config.model not in schema.model:
        return f"{config.model[:80]!r} is not one of {', '.join(schema.model)}"
    return None


def _prompt_allowed(config: AssistantConfig, schema: ConfigSchema) -> str | None:
    if not schema.system_prompt:
        return "not configurable"
    try:
        Prompt(config.system_prompt or "")
    except ConfigError as exc:
        return str(exc)
    return None


def _values_allowed(config: AssistantConfig, schema: ConfigSchema) -> str | None:
    for name in config.template_values or {}:
        if name not in schema.template_values:
            allowed = ", ".join(schema.template_values) or "none"
            return f"{name[:80]!r} is not configurable (configurable: {allowed})"
    return None


def _tools_allowed(config: AssistantConfig, schema: ConfigSchema) -> str | None:
    chosen = config.tools or []
    if schema.tools is None:
        return "not configurable"
    unknown = [t for t in chosen if t not in schema.tools]
    if unknown:
        return f"{unknown[0][:80]!r} is not one of the agent's tools"
    if len(set(chosen)) != len(chosen):
        return "names a tool twice"
    return None


def _steps_allowed(config: AssistantConfig, schema: ConfigSchema) -> str | None:
    if schema.max_steps is None:
        return "not configurable"
    low, high = schema.max_steps
    if not low <= (config.max_steps or 0) <= high:
        return f"{config.max_steps} is not in {low}..{high}"
    return None


def _policy_allowed(config: AssistantConfig, schema: ConfigSchema) -> str | None:
    for name, value in (config.policy or {}).items():
        if name not in schema.policy:
            allowed = ", ".join(schema.policy) or "none"
            return f"{name[:80]!r} is not configurable (configurable: {allowed})"
        if value not in schema.policy[name]:
            return f"{name} must be one of {', '.join(schema.policy[name])}, not {value[:80]!r}"
    return None


#: Each field's check, in field order: the first field at fault is the one named.
_CHECKS: tuple[tuple[str, Callable[[AssistantConfig, ConfigSchema], str | None]], ...] = (
    ("model", _model_allowed),
    ("system_prompt", _prompt_allowed),
    ("template_values", _values_allowed),
    ("tools", _tools_allowed),
    ("max_steps", _steps_allowed),
    ("policy", _policy_allowed),
)


def apply_config(agent: Agent, config: AssistantConfig) -> Agent:
    """The agent a run of this configuration runs: ``agent`` with the configured fields replaced.

    The tool subset keeps the agent's own order and drops a name the agent no longer has (a run
    whose assistant named it was checked when it started); approvals follow the tools kept.
    """
    changes: dict[str, Any] = {}
    values = config.template_values or {}
    system: str | Prompt = (
        Prompt(config.system_prompt) if config.system_prompt is not None else agent.system_prompt
    )
    if values:
        system = prefill(system, values) if isinstance(system, Prompt) else system
        if agent.input_template is not None:
            changes["input_template"] = prefill(agent.input_template, values)
    if config.system_prompt is not None or values:
        changes["system_prompt"] = system
    if config.tools is not None:
        kept = set(config.tools)
        changes["tools"] = ToolSet(t for t in agent.tools if t.name in kept)
        changes["approval_required"] = frozenset(agent.approval_required & kept)
    if config.max_steps is not None:
        changes["max_steps"] = config.max_steps
    if config.policy:
        try:
            updates: dict[str, Any] = dict(config.policy)
            changes["policy"] = dataclasses.replace(agent.policy, **updates)
        except (TypeError, PolicyConfigInvalid) as exc:
            raise ConfigError(f"assistant policy: {exc}") from None
    return dataclasses.replace(agent, **changes) if changes else agent


def prefill(prompt: Prompt, values: Mapping[str, str]) -> Prompt:
    """``prompt`` with the variables ``values`` names filled in, the others left for the run."""
    parts: list[str] = []
    for literal, name, _, _ in string.Formatter().parse(prompt.text):
        parts.append(literal.replace("{", "{{").replace("}", "}}"))
        if name is None:
            continue
        if name in values:
            parts.append(values[name].replace("{", "{{").replace("}", "}}"))
        else:
            parts.append("{" + name + "}")
    return Prompt("".join(parts))


def diff_configs(before: AssistantConfig, after: AssistantConfig) -> list[FieldChange]:
    """The fields that differ between two configurations, in field order (a dict field, such as
    ``policy``, is compared key by key: ``policy.on_tool_error``)."""
    old, new = before.fields_set(), after.fields_set()
    changes: list[FieldChange] = []
    for field in AssistantConfig.model_fields:
        a, b = old.get(field), new.get(field)
        if isinstance(a, dict) or isinstance(b, dict):
            a_map, b_map = a or {}, b or {}
            for key in sorted(set(a_map) | set(b_map)):
                _change(changes, f"{field}.{key}", a_map.get(key), b_map.get(key))
        else:
            _change(changes, field, a, b)
    return changes


def _change(changes: list[FieldChange], field: str, a: Any, b: Any) -> None:
    if json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True):
        return
    kind: Literal["added", "removed", "changed"] = (
        "added" if a is None else "removed" if b is None else "changed"
    )
    changes.append(FieldChange(field=field, before=a, after=b, change=kind))
