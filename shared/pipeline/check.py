"""Checking a pipeline when it is registered: known agents, fitting types, no cycle.

The value a step hands on has a type known from the agents (their ``output_type``, or ``str``);
each mapping function's annotated argument must accept the value it will get, a step's
``expects`` must fit the value before it, and a branch's cases must accept the branching value.
A branch names pipelines registered before it (or agents), so the pipelines a run can reach form
no cycle; naming the pipeline itself is refused as one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shared.errors import ConfigError
from shared.pipeline.definition import Pipeline, Step
from shared.pipeline.types import accepts, item_type, parameter_type, return_type, type_name

__all__ = ["check_pipeline", "output_type_of"]


def output_type_of(agent: Any) -> Any:
    """The type of the value an agent's run hands on: its ``output_type``, or ``str``."""
    return agent.output_type if agent.output_type is not None else str


def check_pipeline(
    pipeline: Pipeline, agent_of: Callable[[str], Any], pipelines: Mapping[str, Pipeline]
) -> None:
    """Raise :class:`ConfigError` naming the first step that cannot work."""
    where = f"pipeline {pipeline.name!r}"
    if not pipeline.steps:
        raise ConfigError(f"{where} has no steps")
    value: Any = pipeline.input_type
    before: tuple[Step, Any] | None = None  # the previous step and its agent
    for step in pipeline.steps:
        at = f"{where}, step {step.name!r}"
        if step.expects is not None and not accepts(step.expects, value):
            raise ConfigError(
                f"{at} expects {type_name(step.expects)} but the step before hands on {type_name(value)}"
            )
        if step.kind == "branch":
            _check_branch(pipeline, step, value, at, agent_of, pipelines)
            return
        agent = _agent(step, at, agent_of)
        if step.state:
            _check_state(step, agent, before, at)
        before = (step, agent)
        if step.kind == "map":
            assert step.over is not None
            _fits(step.over, "over", value, at)
            items = return_type(step.over)
            if not accepts(list, items):
                raise ConfigError(f"{at}: over() must return a list, it is annotated {type_name(items)}")
            _input_fits(step, item_type(items), at)
            value = list[output_type_of(agent)]  # type: ignore[misc]
        else:
            _input_fits(step, value, at)
            value = output_type_of(agent)


def _check_state(step: Step, agent: Any, before: tuple[Step, Any] | None, at: str) -> None:
    """A step that starts from the previous run's state: one run before it, and state types that fit."""
    if before is None or before[0].kind == "map":
        raise ConfigError(f"{at}: state=True needs a then or reduce step (one run) right before it")
    prev_type, this_type = getattr(before[1], "state_type", None), getattr(agent, "state_type", None)
    if prev_type is None or this_type is None:
        raise ConfigError(f"{at}: state=True needs both agents to declare a state_type")
    if not issubclass(prev_type, this_type):
        raise ConfigError(
            f"{at}: the previous run's state is a {prev_type.__name__},"
            f" not the {this_type.__name__} this step's agent keeps"
        )


def _agent(step: Step, at: str, agent_of: Callable[[str], Any]) -> Any:
    assert step.agent is not None
    try:
        return agent_of(step.agent)
    except ConfigError as exc:
        raise ConfigError(f"{at}: {exc}") from None


def _fits(function: Callable[..., Any], role: str, value: Any, at: str) -> None:
    wanted = parameter_type(function)
    if not accepts(wanted, value):
        raise ConfigError(f"{at}: {role}() takes {type_name(wanted)} but gets {type_name(value)}")


def _input_fits(step: Step, value: Any, at: str) -> None:
    if step.input is None:
        return
    _fits(step.input, "input", value, at)
    made = return_type(step.input)
    if not accepts(str, made):
        raise ConfigError(
            f"{at}: input() must return the run's input text, it is annotated {type_name(made)}"
        )


def _check_branch(
    pipeline: Pipeline,
    step: Step,
    value: Any,
    at: str,
    agent_of: Callable[[str], Any],
    pipelines: Mapping[str, Pipeline],
) -> None:
    assert step.choose is not None
    _fits(step.choose, "choose", value, at)
    for case, target in step.cases.items():
        if target == pipeline.name:
            raise ConfigError(f"{at}: case {case!r} goes back to pipeline {target!r}: a cycle")
        if target in pipelines:
            wanted = pipelines[target].input_type
            if not accepts(wanted, value):
                raise ConfigError(
                    f"{at}: case {case!r} goes to pipeline {target!r}, which takes {type_name(wanted)},"
                    f" with {type_name(value)}"
                )
            continue
        try:
            agent_of(target)
        except ConfigError:
            raise ConfigError(
                f"{at}: case {case!r} names {target!r}, neither an agent nor a pipeline registered"
                " before this one"
            ) from None
