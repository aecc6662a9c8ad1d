"""Prompt templates: system prompts and user inputs with named variables.

A template names its variables in braces; ``{{`` and ``}}`` are literal braces. The variables are
filled from the run: ``input`` is the user's input, every other name is a key of the run's
``metadata``::

    Agent(
        name="translator",
        system_prompt=Prompt("You translate into {language}. Keep a {tone} tone."),
        input_template=Prompt("Translate this: {input}"),
        ...
    )
    client.submit("translator", "Guten Morgen", metadata={"language": "French", "tone": "formal"})

A template is parsed when the agent is built (a malformed one is a :class:`ConfigError` at
registration), and the variables it needs are published with the agent, so a submit that lacks
one is refused at once (:class:`InvalidRequest`) instead of failing in a worker.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.errors import ConfigError, InvalidRequest

__all__ = ["INPUT_VARIABLE", "MAX_VALUE_CHARS", "Prompt", "missing_variables"]

#: The variable that stands for the run's input; every other variable is a metadata key.
INPUT_VARIABLE = "input"
#: A metadata value longer than this (as text) is refused when it fills a variable.
MAX_VALUE_CHARS = 20_000


@dataclass(frozen=True)
class Prompt:
    """A template with named variables, checked when it is built."""

    text: str
    variables: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        names: set[str] = set()
        try:
            parsed = list(string.Formatter().parse(self.text))
        except ValueError as exc:
            raise ConfigError(f"prompt template {self.text[:80]!r} is malformed: {exc}") from None
        for _, name, spec, conversion in parsed:
            if name is None:
                continue
            if not name.isidentifier():
                raise ConfigError(
                    f"prompt template variable {{{name}}} must be a plain name (letters, digits, _)"
                )
            if spec or conversion:
                raise ConfigError(f"prompt template variable {{{name}}} takes no format spec or conversion")
            names.add(name)
        object.__setattr__(self, "variables", frozenset(names))

    def render(self, input: str, metadata: Mapping[str, Any]) -> str:
        """The text with every variable filled; raises :class:`InvalidRequest` for a missing one."""
        missing = missing_variables(self.variables, metadata)
        if missing:
            raise InvalidRequest(f"the prompt needs metadata {', '.join(map(repr, missing))}")
        values: dict[str, str] = {}
        for name in self.variables:
            value = input if name == INPUT_VARIABLE else metadata[name]
            text = value if isinstance(value, str) else str(value)
            if len(text) > MAX_VALUE_CHARS:
                raise InvalidRequest(f"metadata {name!r} is over {MAX_VALUE_CHARS} characters")
            values[name] = text
        return self.text.format(**values)


def missing_variables(variables: frozenset[str] | list[str], metadata: Mapping[str, Any]) -> list[str]:
    """The variables a run's metadata does not fill (``input`` is always filled), sorted."""
    return sorted(v for v in variables if v != INPUT_VARIABLE and metadata.get(v) is None)
