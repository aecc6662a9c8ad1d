"""A pipeline of runs: agent steps composed with ``then``, ``map``, ``reduce`` and ``branch``.

Each step is one agent run (a ``map`` step: one run per item), and the value it hands on is the
run's typed output (an instance of the agent's ``output_type``) or, without one, its answer text::

    research = (
        Pipeline("research-split")
        .then("splitter")                                  # its output: SubQuestions
        .map("researcher", over=questions, concurrency=8)  # one run per sub-question
        .reduce("writer", input=merge)                     # one run over every answer, in item order
    )
    registry.add_pipeline(research)

* ``then(agent, input=f)``: ``f(value) -> str`` is the run's input (default: the value itself if it
  is text, else its JSON).
* ``map(agent, over=g, input=f, concurrency=n)``: ``g(value) -> list`` gives the items; ``f(item)``
  each run's input; at most ``n`` of the step's runs live at once, across the whole pool.
* ``reduce(agent, input=f)``: after a ``map``; ``f(values)`` gets the map's values in item order
  (skipped items left out).
* ``branch(choose, cases)``: the last step; ``choose(value)`` names a case, and the run goes on
  with that case's pipeline (or agent), which gets the same value.

The mapping functions run in the workers, so they must be plain deterministic functions of
their argument. :meth:`AgentRegistry.add_pipeline` checks the pipeline against the agents: every
agent known, the annotated types of the mapping functions fitting the values they get, and no
cycle through branches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from shared.errors import ConfigError

__all__ = [
    "MAX_CONCURRENCY",
    "MAX_RETRIES",
    "MAX_STEPS",
    "OnError",
    "Pipeline",
    "Step",
    "StepKind",
]

StepKind = Literal["then", "map", "reduce", "branch"]
#: What a step does when a child run fails (after its retries): fail the pipeline, or leave the
#: item out (``map`` steps only).
OnError = Literal["fail", "skip"]

#: Steps one pipeline may have.
MAX_STEPS = 50
#: Retries of one child run a step may ask for.
MAX_RETRIES = 5
#: A map step's cap on its live runs.
MAX_CONCURRENCY = 1000


@dataclass(frozen=True)
class Step:
    """One step of a pipeline (built by the :class:`Pipeline` methods, not by hand)."""

    kind: StepKind
    #: Names the step in statuses and errors; unique within its pipeline.
    name: str
    #: The agent each of its runs runs (None for a branch).
    agent: str | None = None
    #: ``then``/``map``/``reduce``: the value (a ``map``: one item) -> the run's input text.
    input: Callable[[Any], str] | None = None
    #: ``map``: the previous step's value -> the items.
    over: Callable[[Any], list[Any]] | None = None
    #: ``branch``: the previous step's value -> the name of a case.
    choose: Callable[[Any], str] | None = None
    #: ``branch``: case name -> the pipeline (or agent) the run goes on with.
    cases: Mapping[str, str] = field(default_factory=dict)
    #: ``map``: at most this many of the step's runs live at once (pool-wide).
    concurrency: int = 1
    #: Runs again a failed child up to this many times, each with its own run id.
    retries: int = 0
    on_error: OnError = "fail"
    #: The type the step expects from the previous step (checked at registration).
    expects: Any = None
    #: Start each of the step's runs from the custom run state the previous step's run ended with
    #: (the previous step is one run: ``then`` or ``reduce``; checked at registration).
    state: bool = False


class Pipeline:
    """An immutable chain of steps; each method returns a new pipeline with one more step."""

    def __init__(
        self, name: str, *, input_type: Any = str, description: str = "", steps: tuple[Step, ...] = ()
    ) -> None:
        if not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ConfigError(f"pipeline name {name!r} must be alphanumeric (with - _ .)")
        self.name = name
        #: The value the first step gets: the submitted input text, or (a pydantic model) that
        #: input parsed as JSON; a pipeline reached by a branch gets the branching value.
        self.input_type = input_type
        self.description = description
        self.steps = steps

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}, steps={[s.name for s in self.steps]})"

    def then(
        self,
        agent: str,
        *,
        input: Callable[[Any], str] | None = None,
        name: str | None = None,
        expects: Any = None,
        retries: int = 0,
        state: bool = False,
    ) -> Pipeline:
        """One run of ``agent`` on the previous value (``input(value)``); with ``state``, starting
        from the run state the previous step's run ended with."""
        step = Step("then", name or agent, agent, input=input, expects=expects, retries=retries, state=state)
        return self._add(step)

    def map(
        self,
        agent: str,
        *,
        over: Callable[[Any], list[Any]],
        input: Callable[[Any], str] | None = None,
        concurrency: int = 8,
        name: str | None = None,
        expects: Any = None,
        retries: int = 0,
        on_error: OnError = "fail",
        state: bool = False,
    ) -> Pipeline:
        """One run of ``agent`` per item of ``over(value)``, at most ``concurrency`` live at once;
        with ``state``, each starting from the run state the previous step's run ended with."""
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise ConfigError(f"pipeline {self.name!r}: map concurrency must be in 1..{MAX_CONCURRENCY}")
        step = Step(
            "map",
            name or agent,
            agent,
            input=input,
            over=over,
            concurrency=concurrency,
            expects=expects,
            retries=retries,
            on_error=on_error,
            state=state,
        )
        return self._add(step)

    def reduce(
        self,
        agent: str,
        *,
        input: Callable[[Any], str] | None = None,
        name: str | None = None,
        expects: Any = None,
        retries: int = 0,
    ) -> Pipeline:
        """One run of ``agent`` over the previous map's values, in item order."""
        return self._add(Step("reduce", name or agent, agent, input=input, expects=expects, retries=retries))

    def branch(
        self,
        choose: Callable[[Any], str],
        cases: Mapping[str, str],
        *,
        name: str = "branch",
        expects: Any = None,
    ) -> Pipeline:
        """Go on with ``cases[choose(value)]`` (a pipeline's or an agent's name); the last step."""
        if not cases:
            raise ConfigError(f"pipeline {self.name!r}: a branch needs at least one case")
        return self._add(Step("branch", name, None, choose=choose, cases=dict(cases), expects=expects))

    def _add(self, step: Step) -> Pipeline:
        where = f"pipeline {self.name!r}"
        if len(self.steps) >= MAX_STEPS:
            raise ConfigError(f"{where}: more than {MAX_STEPS} steps")
        if self.steps and self.steps[-1].kind == "branch":
            raise ConfigError(f"{where}: a branch is the last step; add steps to its cases' pipelines")
        if not 0 <= step.retries <= MAX_RETRIES:
            raise ConfigError(f"{where}: step {step.name!r}: retries must be in 0..{MAX_RETRIES}")
        if step.on_error not in ("fail", "skip"):
            raise ConfigError(f"{where}: step {step.name!r}: on_error must be 'fail' or 'skip'")
        if step.kind == "reduce" and (not self.steps or self.steps[-1].kind != "map"):
            raise ConfigError(f"{where}: reduce step {step.name!r} must follow a map step")
        taken = {s.name for s in self.steps}
        if step.name in taken:
            n = 2
            while f"{step.name}-{n}" in taken:
                n += 1
            step = replace(step, name=f"{step.name}-{n}")
        return Pipeline(
            self.name, input_type=self.input_type, description=self.description, steps=(*self.steps, step)
        )
