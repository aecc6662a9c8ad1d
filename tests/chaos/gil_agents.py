"""The test agents, plus retry-safe tools that hold the GIL for seconds (``--agents`` of a worker).

Two ways of holding it: libc's ``sleep`` called with the GIL held (an exact duration), and a pure
Python builtin that never lets go of it while it spins (``sum`` over a ``range``: one C loop that
checks for no other thread), sized at the call for about the seconds asked.
"""

from __future__ import annotations

import time

from shared.agents import Agent
from shared.llm.scripted import ScriptedModel, reply
from shared.tools import ToolContext, ToolSet, tool
from tests.agents_fixture import EFFECTS_KEY, STARTS_KEY, HoldArgs, _record, _sleep_holding_the_gil, registry

__all__ = ["registry"]

#: Items summed to time the machine before the long spin.
_PROBE = 2_000_000


def _spin_holding_the_gil(seconds: float) -> None:
    started = time.perf_counter()
    sum(range(_PROBE))
    per_item = max(time.perf_counter() - started, 1e-6) / _PROBE
    sum(range(int(seconds / per_item)))


@tool
def sleep_holding_gil(args: HoldArgs, ctx: ToolContext) -> str:
    """A retry-safe tool stuck in C code that holds the GIL (think: a blocking C driver)."""
    _record(STARTS_KEY, ctx)
    _sleep_holding_the_gil(args.seconds)
    _record(EFFECTS_KEY, ctx)
    return "slept holding the GIL"


@tool
def spin_holding_gil(args: HoldArgs, ctx: ToolContext) -> str:
    """A retry-safe tool that computes in one builtin call, holding the GIL all along."""
    _record(STARTS_KEY, ctx)
    _spin_holding_the_gil(args.seconds)
    _record(EFFECTS_KEY, ctx)
    return "spun holding the GIL"


#: Agents whose one call holds the GIL for 8 s: four chaos leases.
GIL_AGENTS = {"gil_sleep": sleep_holding_gil, "gil_spin": spin_holding_gil}

for _name, _tool in GIL_AGENTS.items():
    registry.add_model(_name, ScriptedModel([reply(None, (_tool.name, {"seconds": 8})), reply("held it")]))
    registry.add(
        Agent(
            name=_name,
            model=f"scripted:{_name}",
            system_prompt=f"test agent {_name}",
            tools=ToolSet([_tool]),
        )
    )
