"""What an agent lets assistants configure, and what an assistant may be called.

The part of assistants an agent and a worker need on every run: the author's declaration
(:class:`Configurable`), the schema a worker derives from it and advertises in the worker registry
(:func:`schema_of`, :class:`ConfigSchema`) and the check of an assistant's name in a run request.
Assistants' configurations themselves, their versions and how they apply to an agent are in
``shared/assistants.py``, which a worker loads with the first run that names an assistant: this
module is apart so that a worker whose runs name none does not carry their models.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from shared.errors import ConfigError, InvalidRequest
from shared.prompts import INPUT_VARIABLE

if TYPE_CHECKING:
    from shared.agents import Agent

__all__ = [
    "ASSISTANT_NAME_PATTERN",
    "ConfigSchema",
    "Configurable",
    "POLICY_CHOICES",
    "check_assistant_name",
    "schema_of",
]

#: An assistant's name: it goes in URL paths and Redis keys, so no ``/`` and no ``:``.
ASSISTANT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
_ASSISTANT_NAME = re.compile(ASSISTANT_NAME_PATTERN)

#: The fields of :class:`~shared.policy.Policy` an author may open to assistants, with their values.
POLICY_CHOICES: dict[str, tuple[str, ...]] = {
    "on_tool_error": ("fail_fast", "append_error_and_continue"),
    "on_unknown_outcome": ("fail", "await_approval"),
    "on_truncated": ("accept", "reprompt", "fail"),
}


def check_assistant_name(name: Any) -> str:
    """An assistant's name, or :class:`InvalidRequest` saying what a name may be."""
    if not isinstance(name, str) or not _ASSISTANT_NAME.match(name):
        shown = name[:80] if isinstance(name, str) else type(name).__name__
        raise InvalidRequest(
            f"assistant name {shown!r} must be 1..100 letters, digits and . _ -"
            " (starting with a letter or digit)"
        )
    return name


@dataclass(frozen=True)
class Configurable:
    """What an agent's author lets assistants configure; anything else is refused by name.

    ``model``: True for any ``PROVIDER:MODEL``, or the tuple of the ones allowed.
    ``system_prompt``: the assistant may replace the system prompt (a template, as the agent's).
    ``template_values``: the variables of the agent's templates an assistant may fill.
    ``tools``: the assistant may offer a subset of the agent's own tools.
    ``max_steps``: the inclusive bounds of the step budget an assistant may set.
    ``policy``: the :class:`~shared.policy.Policy` fields an assistant may set (of :data:`POLICY_CHOICES`).
    """

    model: bool | tuple[str, ...] = False
    system_prompt: bool = False
    template_values: tuple[str, ...] = ()
    tools: bool = False
    max_steps: tuple[int, int] | None = None
    policy: tuple[str, ...] = ()

    def check(self, agent: str) -> None:
        """Raise :class:`ConfigError` for a declaration that cannot work (called by the agent)."""
        if isinstance(self.model, tuple) and not all(isinstance(m, str) and ":" in m for m in self.model):
            raise ConfigError(f"agent {agent!r}: configurable model choices must look like PROVIDER:MODEL")
        if not all(isinstance(v, str) and v.isidentifier() for v in self.template_values):
            raise ConfigError(f"agent {agent!r}: configurable template_values must be variable names")
        if INPUT_VARIABLE in self.template_values:
            raise ConfigError(f"agent {agent!r}: {INPUT_VARIABLE!r} is the run's input, not a template value")
        if self.max_steps is not None:
            low, high = self.max_steps
            if not 1 <= low <= high <= 1000:
                raise ConfigError(f"agent {agent!r}: configurable max_steps must be (low, high) in 1..1000")
        unknown = sorted(set(self.policy) - set(POLICY_CHOICES))
        if unknown:
            raise ConfigError(
                f"agent {agent!r}: configurable policy fields {unknown}"
                f" are not among {sorted(POLICY_CHOICES)}"
            )


class ConfigSchema(BaseModel):
    """What an agent lets assistants configure, as workers advertise it (JSON): :class:`Configurable`
    with the agent's own tool names and variables filled in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: bool | list[str] = Field(
        default=False, description="true: any PROVIDER:MODEL; a list: one of these; false: not configurable."
    )
    system_prompt: bool = False
    template_values: list[str] = Field(default_factory=list)
    tools: list[str] | None = Field(
        default=None, description="The tools an assistant may choose a subset of; null: not configurable."
    )
    max_steps: tuple[int, int] | None = None
    policy: dict[str, list[str]] = Field(default_factory=dict)


def schema_of(agent: Agent) -> ConfigSchema | None:
    """What ``agent`` lets assistants configure (None: nothing, no assistant can name it)."""
    declared = agent.configurable
    if declared is None:
        return None
    return ConfigSchema(
        model=list(declared.model) if isinstance(declared.model, tuple) else declared.model,
        system_prompt=declared.system_prompt,
        template_values=sorted(declared.template_values),
        tools=list(agent.tools.names) if declared.tools else None,
        max_steps=declared.max_steps,
        policy={name: list(POLICY_CHOICES[name]) for name in sorted(declared.policy)},
    )
