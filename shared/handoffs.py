"""Handoffs: an agent hands the conversation to another agent, and the same run goes on under it.

Unlike a subagent (``shared/subagents.py``: a child run answers a tool call), a handoff starts no
run: the model of the current agent calls ``transfer_to_<target>`` (one tool per declared target,
``Agent(handoffs=[...])``), and the think commits the handoff as its move (``fsm.Thinking.hand_off``):

- the transfer call is answered with a tool message (providers require every call answered); the
  reply's other calls are answered "not run" and never run (a handoff wins over everything else in
  its reply, so no tool runs on behalf of an agent that is no longer in charge);
- the target's system prompt is appended to the stored conversation, and with an ``input_filter``
  the history the target sees is the filter's result, appended after it (applied once, committed);
- the head records the handoff (``RunHead.handoffs``), so the next phases use the target's tools,
  policy and step budget, its version and its model; a ``HandedOff`` event is appended with it.

The commit is the single source of the handoff: a worker killed before it leaves nothing, and the
phase handed on asks the model again; one killed after it is fenced off by the version.

A handoff the runtime refuses (a target this worker does not have, or past ``Agent.max_handoffs``
handoffs in the run, a cycle counting like any) is answered to the model as an error and the run
goes on under the current agent (``fsm.Thinking.refuse_handoff``): the model can carry on itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, TypeAdapter

from shared.errors import ConfigError
from shared.messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolMessage, UserMessage
from shared.state import HandoffRecord
from shared.tools import Tool, ToolSet

if TYPE_CHECKING:
    from shared.agents import Agent

__all__ = [
    "HANDOFF_PREFIX",
    "MAX_HANDOFFS_CEILING",
    "Handoff",
    "HandoffArgs",
    "HandoffChoice",
    "InputFilter",
    "answers",
    "choose_handoff",
    "conversation_of",
    "handoff_tool",
    "handoff_tool_name",
    "history_for_target",
    "keep_last_messages",
    "normalised",
    "offered_tools",
    "paired",
    "remove_tool_calls",
]

#: A handoff tool's name is this prefix and its target's name (``-`` and ``.`` as ``_``).
HANDOFF_PREFIX = "transfer_to_"
#: The most handoffs any agent may allow in one run: each one is kept on the run's head.
MAX_HANDOFFS_CEILING = 20

#: What a handoff's ``input_filter`` is: the history the target would see (the conversation without
#: its system prompt, the transfer call and its answer last) in, the history it sees out.
InputFilter = Callable[[list[Message]], list[Message]]


@dataclass(frozen=True)
class Handoff:
    """A target an agent may hand the conversation to: ``Handoff("billing")``.

    ``description`` is what the model is told about the transfer tool; ``input_filter`` trims (or
    redacts) the history the target sees, once, when it takes over; it must be deterministic and
    return messages only (tool calls left without results and results left without calls are
    dropped after it, as providers refuse both).
    """

    agent: str
    description: str | None = None
    input_filter: InputFilter | None = None
    #: The transfer tool's name; default ``transfer_to_<agent>``.
    tool_name: str | None = None

    def __post_init__(self) -> None:
        if not self.agent:
            raise ConfigError("a Handoff needs the name of the agent it hands to")
        if self.input_filter is not None and not callable(self.input_filter):
            raise ConfigError(f"the input_filter of the handoff to {self.agent!r} must be callable")

    @property
    def name(self) -> str:
        return self.tool_name or handoff_tool_name(self.agent)


def handoff_tool_name(agent: str) -> str:
    """The transfer tool of a handoff to ``agent``, as the model sees it."""
    return HANDOFF_PREFIX + agent.replace("-", "_").replace(".", "_")


class HandoffArgs(BaseModel):
    """A transfer takes no arguments (the target reads the conversation); extra ones are ignored."""

    model_config = ConfigDict(extra="ignore")


_STR: TypeAdapter[str] = TypeAdapter(str)


def _not_called(args: HandoffArgs) -> str:
    raise RuntimeError("a handoff is committed by the think, never run as a tool")


def handoff_tool(handoff: Handoff) -> Tool:
    """The tool the model calls to hand off: validated like any tool, never run in a tool task."""
    description = handoff.description or f"Hand the conversation over to the {handoff.agent} agent."
    return Tool(
        name=handoff.name,
        description=description,
        args_model=HandoffArgs,
        result_adapter=_STR,
        fn=_not_called,
        takes_context=False,
    )


def normalised(agent_name: str, handoffs: Sequence[Handoff | str]) -> tuple[Handoff, ...]:
    """An agent's declared handoffs as :class:`Handoff` values (plain names allowed), checked: no
    two transfer tools of one name (one target may have two, with different filters)."""
    result = tuple(h if isinstance(h, Handoff) else Handoff(h) for h in handoffs)
    if not all(isinstance(h, Handoff) for h in result):
        raise ConfigError(f"agent {agent_name!r}: handoffs must be Handoff values or agent names")
    names = [h.name for h in result]
    if len(set(names)) != len(names):
        raise ConfigError(f"agent {agent_name!r}: a handoff's transfer tool is declared twice")
    return result


def offered_tools(agent: Agent) -> ToolSet:
    """Every tool the model of ``agent`` is offered: its own, then one transfer tool per handoff
    (a name clash is a ``ConfigError`` when the agent is built, see ``Agent``)."""
    if not agent.handoff_targets:
        return agent.tools
    return ToolSet([*agent.tools, *(handoff_tool(h) for h in agent.handoff_targets)])


@dataclass(frozen=True)
class HandoffChoice:
    """What a reply with transfer calls asks for: the handoff that wins and its call."""

    handoff: Handoff
    call: ToolCall


def choose_handoff(agent: Agent, calls: Sequence[ToolCall]) -> HandoffChoice | None:
    """The handoff a reply's accepted calls ask for: the first transfer call in call order (None:
    the reply has none). The reply's other calls, transfers included, are answered "not run"."""
    by_tool = {h.name: h for h in agent.handoff_targets}
    for call in calls:
        if call.name in by_tool:
            return HandoffChoice(by_tool[call.name], call)
    return None


def answers(
    calls: Sequence[ToolCall], chosen: ToolCall, chosen_answer: str, error: bool
) -> list[ToolMessage]:
    """One tool message per call of the reply, in call order: the transfer's answer for the chosen
    call, and "not run" for every other (none of them ran)."""
    messages = []
    for call in calls:
        if call.id == chosen.id:
            messages.append(
                ToolMessage(tool_call_id=call.id, name=call.name, content=chosen_answer, is_error=error)
            )
        else:
            why = (
                "Not run: a handoff was asked for in the same reply."
                if not error
                else "Not run: it came with a handoff that was refused; call it again if it is still needed."
            )
            messages.append(ToolMessage(tool_call_id=call.id, name=call.name, content=why, is_error=True))
    return messages


def conversation_of(handoffs: Sequence[HandoffRecord], messages: Sequence[Message]) -> list[Message]:
    """The conversation the run's current agent sees, from the stored (append-only) list.

    Without handoffs, all of it. After a handoff, the target's system prompt (stored at the
    handoff's ``at``) takes the place of the one before; with ``history="kept"`` the conversation
    as it was follows it, with ``"filtered"`` the filtered copy stored after it does; then what
    was said since. Bounded: a run has at most ``MAX_HANDOFFS_CEILING`` handoffs.
    """
    if not handoffs:
        return list(messages)
    record = handoffs[-1]
    segment = list(messages[record.at :])
    if record.history == "filtered" or not segment:
        return segment
    before = conversation_of(handoffs[:-1], messages[: record.at])
    return [segment[0], *_without_system(before), *segment[1:]]


def _without_system(messages: Sequence[Message]) -> list[Message]:
    return [m for m in messages if not isinstance(m, SystemMessage)]


def history_for_target(conversation: Sequence[Message]) -> list[Message]:
    """What a handoff's target takes over: the conversation without its system prompt."""
    return _without_system(conversation)


def paired(messages: Sequence[Message]) -> list[Message]:
    """``messages`` with every tool call answered and every tool result called: an assistant
    message's calls without results lose their calls (its text is kept), results without their
    call go. Providers refuse either, and an input filter may leave both."""
    called = {c.id for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls}
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    kept: list[Message] = []
    for m in messages:
        if isinstance(m, ToolMessage):
            if m.tool_call_id in called:
                kept.append(m)
        elif isinstance(m, AssistantMessage) and m.tool_calls:
            calls = [c for c in m.tool_calls if c.id in answered]
            if calls or m.content:
                kept.append(AssistantMessage(content=m.content, tool_calls=calls))
        else:
            kept.append(m)
    return kept


# -- shipped input filters ------------------------------------------------------------------------


def remove_tool_calls(messages: list[Message]) -> list[Message]:
    """The history without tool calls and their results (the target sees what was said only)."""
    kept: list[Message] = []
    for m in messages:
        if isinstance(m, ToolMessage):
            continue
        if isinstance(m, AssistantMessage):
            if m.content:
                kept.append(AssistantMessage(content=m.content))
            continue
        kept.append(m)
    return kept


def keep_last_messages(n: int) -> InputFilter:
    """A filter keeping the user's first message and the newest ``n`` messages of the history."""
    if n < 1:
        raise ConfigError("keep_last_messages needs n >= 1")

    def keep(messages: list[Message]) -> list[Message]:
        first = next((m for m in messages if isinstance(m, UserMessage)), None)
        tail = messages[-n:]
        return tail if first is None or any(m is first for m in tail) else [first, *tail]

    return keep
