"""Agents of the operations tests: a tool that writes a log line (to see what the line carries)."""

from __future__ import annotations

import logging

from pydantic import BaseModel

from shared.agents import Agent, AgentRegistry
from shared.llm.scripted import ScriptedModel, reply
from shared.tools import ToolSet, tool

log = logging.getLogger("tests.ops")


class NoteArgs(BaseModel):
    text: str


@tool
def note(args: NoteArgs) -> str:
    """Write a note to the log."""
    log.warning("noting %s", args.text)
    return args.text


registry = AgentRegistry()
registry.add_model("noting", ScriptedModel([reply(None, ("note", {"text": "hello"})), reply("noted")]))
registry.add(Agent(name="noting", model="scripted:noting", system_prompt="note", tools=ToolSet([note])))
