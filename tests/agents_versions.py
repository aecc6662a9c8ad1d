"""Agents of the deploy tests: the same agent, ``deploy``, in the version ``$AGENT_VERSION`` names
(default 1), differing only in a visible behaviour: its tool records the version of the code that
ran it (``test:ran:<run_id>``, a list), and its answer says it (``answered by v<N>``).

``$AGENT_COMPATIBLE`` (a version) declares that older version compatible; ``$AGENT_MIGRATE_FROM``
(a version) migrates its runs, setting the state's ``migrated_from``; each call of the migration
function is recorded (``test:migrated:<run_id>``, a list of ``<version>:<pid>``), so a test can
tell how often it ran from how often it was committed. ``$AGENT_APPROVE`` (any value) makes
``mark`` need a human's approval, so runs park holding no worker.

``desk`` (version ``$DESK_VERSION``, default 1) hands every conversation to ``deploy``: the run goes
on under the version of ``deploy`` that the handing worker serves.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cache
from typing import Any

import redis
from pydantic import BaseModel

from shared.agents import Agent, AgentRegistry
from shared.llm.base import ModelResponse
from shared.llm.scripted import ScriptedModel, reply
from shared.messages import Message, ToolMessage
from shared.tools import ToolContext, ToolSet, tool
from shared.versions import Migration
from tests.broker import redis_from_env

VERSION = os.environ.get("AGENT_VERSION", "1")
RAN_KEY = "test:ran:{}"
MIGRATED_KEY = "test:migrated:{}"


@cache
def _redis() -> redis.Redis:
    return redis_from_env()


class DeployState(BaseModel):
    migrated_from: str = ""


class Mark(BaseModel):
    pass


@tool(retry_safe=True)
def mark(args: Mark, ctx: ToolContext) -> str:
    """Record which version of the code ran this call."""
    _redis().rpush(RAN_KEY.format(ctx.run_id), VERSION)
    return f"marked by v{VERSION}"


def _script(messages: Sequence[Message]) -> ModelResponse:
    if not any(isinstance(m, ToolMessage) and m.name == "mark" for m in messages):
        return reply(None, ("mark", {}))
    return reply(f"answered by v{VERSION}")


def _migrate(run: Migration) -> dict[str, Any]:
    _redis().rpush(MIGRATED_KEY.format(run.run_id), f"{VERSION}:{os.getpid()}")
    return {"migrated_from": run.from_version}


def _desk(messages: Sequence[Message]) -> ModelResponse:
    return reply("Passing you to deploy.", ("transfer_to_deploy", {}))


registry = AgentRegistry()
registry.add_model("deploy", ScriptedModel(_script))
registry.add_model("desk", ScriptedModel(_desk))
compatible = os.environ.get("AGENT_COMPATIBLE")
migrate = os.environ.get("AGENT_MIGRATE_FROM")
registry.add(
    Agent(
        name="deploy",
        model="scripted:deploy",
        system_prompt="Mark, then answer.",
        tools=ToolSet([mark]),
        version=VERSION,
        state_type=DeployState,
        compatible_versions=(compatible,) if compatible else (),
        migrate_from={migrate: _migrate} if migrate else None,
        approval_required=frozenset({"mark"}) if os.environ.get("AGENT_APPROVE") else frozenset(),
    )
)
registry.add(
    Agent(
        name="desk",
        model="scripted:desk",
        system_prompt="Hand every question to deploy.",
        version=os.environ.get("DESK_VERSION", "1"),
        handoffs=("deploy",),
    )
)
