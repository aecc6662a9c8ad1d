"""Agents of the thread-policy tests beside every agent of ``tests.agents_fixture`` (workers serve
this module: ``agents="tests.agents_threads"``).

* ``thread_steps`` — for each new user message: a retry-safe ``slow`` call (step 1), then a
  non-retry-safe ``charge`` (step 2), then the answer ``charged`` (step 3). Both tools count their
  starts and effects by idempotency key (``test:starts`` / ``test:effects``), so a test can kill
  the run's worker in its think or its first tool and check what ran how often.
* ``thread_look`` — for each new user message: a retry-safe call that waits for the test's gate (a
  file ``open`` in ``$WESICHAIN_TEST_GATE_DIR``), then the answer ``looked``: a busy run that
  survives any restart, as it may run again.
* ``echo_reject`` — ``echo``'s answers (how many messages and tool results it was given), with the
  thread policy ``reject`` as the agent's default.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from shared.agents import Agent
from shared.llm.base import ModelResponse
from shared.llm.scripted import ScriptedModel, reply
from shared.messages import Message, ToolMessage, UserMessage
from shared.tools import ToolSet, tool
from tests.agents_fixture import GATE_DIR_ENV, TOOLS, SleepArgs, registry

__all__ = ["registry"]

#: How long ``thread_steps``'s retry-safe call sleeps (long enough for a test to see it running).
SLOW_S = 0.2


def _steps_on_each_message(messages: Sequence[Message]) -> ModelResponse:
    since_user = 0
    for m in reversed(messages):
        if isinstance(m, UserMessage):
            break
        since_user += isinstance(m, ToolMessage)
    if since_user == 0:
        return reply(None, ("slow", {"seconds": SLOW_S, "label": "look"}))
    if since_user == 1:
        return reply(None, ("charge", {"seconds": 0, "label": "pay"}))
    return reply("charged")


registry.add_model("thread_steps", ScriptedModel(_steps_on_each_message))
registry.add(Agent(name="thread_steps", model="scripted:thread_steps", system_prompt="steps", tools=TOOLS))


def _echo(messages: Sequence[Message]) -> ModelResponse:
    seen = sum(1 for m in messages if isinstance(m, ToolMessage))
    return reply(f"seen {seen} tool results in {len(messages)} messages")


registry.add_model("echo_reject", ScriptedModel(_echo))
registry.add(
    Agent(
        name="echo_reject",
        model="scripted:echo_reject",
        system_prompt="echo",
        tools=TOOLS,
        thread_policy="reject",
    )
)


@tool
def look_gated(args: SleepArgs) -> str:
    """Retry-safe: waits (up to ``seconds``) for the gate to open."""
    gate = os.path.join(os.environ[GATE_DIR_ENV], "open")
    deadline = time.monotonic() + args.seconds
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)
    return "gate open" if os.path.exists(gate) else "gate still closed"


def _look_on_each_message(messages: Sequence[Message]) -> ModelResponse:
    if isinstance(messages[-1], UserMessage):
        return reply(None, ("look_gated", {"seconds": 60, "label": "look"}))
    return reply("looked")


registry.add_model("thread_look", ScriptedModel(_look_on_each_message))
registry.add(
    Agent(name="thread_look", model="scripted:thread_look", system_prompt="look", tools=ToolSet([look_gated]))
)
