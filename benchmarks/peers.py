"""The same agents without durable distribution: an in-process asyncio loop, and LangGraph.

Both peers run in the benchmark's own process, on the very scripted replies and typed tools the
workers use (``benchmarks.agents``):

* :func:`asyncio_run`: the loop one writes by hand: call the model, validate its tool calls, run
  them (concurrently), append the results, repeat. No persistence, no broker: the floor.
* :class:`LangGraphPeer`: a LangGraph ``StateGraph`` (``agent`` node + prebuilt ``ToolNode``, routed by
  ``tools_condition``) over a fake chat model bound to the same tools, with the in-memory
  checkpointer, the SQLite checkpointer (a file on disk), or none.

LangGraph is an optional extra (``pip install -e '.[peers]'``); :func:`langgraph_available` says
whether it can be imported.
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.agents import SCRIPTS, TOOLS
from shared.actions import accept_tool_calls
from shared.llm.base import ModelRequest, ModelResponse
from shared.llm.scripted import ScriptedModel
from shared.messages import AssistantMessage, Message, SystemMessage, ToolMessage, UserMessage
from shared.settings import Limits
from shared.tools import ToolContext

LIMITS = Limits()


def _ctx(run_id: str, step: int, call_id: str) -> ToolContext:
    return ToolContext(run_id=run_id, step=step, call_id=call_id, deadline=time.time() + 60)


# -- the in-process asyncio loop


async def _asyncio_agent(agent: str, text: str) -> tuple[str, int]:
    model = ScriptedModel(SCRIPTS[agent])
    messages: list[Message] = [SystemMessage(content=f"benchmark agent {agent}"), UserMessage(content=text)]
    specs = TOOLS.specs()
    run_id = uuid.uuid4().hex
    for step in range(1, 1001):
        response = model.complete(ModelRequest(model=agent, messages=messages, tools=specs))
        calls = accept_tool_calls(response, TOOLS, step, LIMITS)
        if not calls:
            return response.text or "", step
        messages.append(AssistantMessage(content=response.text, tool_calls=calls))

        async def invoke(call: Any, step: int = step) -> ToolMessage:
            tool = TOOLS.get(call.name)
            assert tool is not None
            output = tool.invoke(tool.validate(call.arguments), _ctx(run_id, step, call.id))
            return ToolMessage(tool_call_id=call.id, name=call.name, content=output)

        messages.extend(await asyncio.gather(*(invoke(c) for c in calls)))
    raise RuntimeError("step budget exhausted")


def asyncio_run(agent: str, text: str) -> tuple[str, int, float]:
    """Run one agent on a fresh event loop; returns (answer, model calls, seconds)."""
    started = time.perf_counter()
    answer, steps = asyncio.run(_asyncio_agent(agent, text))
    return answer, steps, time.perf_counter() - started


# -- LangGraph


def langgraph_available() -> str | None:
    """None when LangGraph and its SQLite checkpointer import; otherwise why not."""
    try:
        import langgraph.checkpoint.sqlite
        import langgraph.graph
        import langgraph.prebuilt  # noqa: F401
    except ImportError as exc:
        return f"{exc} (install the extra: pip install -e '.[peers]')"
    return None


def _script_reply(agent: str, text: str, turn: int) -> ModelResponse:
    """Our scripted reply for the given assistant turn of a conversation started with ``text``."""
    script = SCRIPTS[agent]
    if callable(script):
        history: list[Message] = [UserMessage(content=text), *[AssistantMessage() for _ in range(turn)]]
        return script(history)
    return script[turn]


def _build_langgraph(checkpointer: Any) -> Callable[[str, str, dict[str, Any]], Any]:
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import StructuredTool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    class ScriptedChatModel(BaseChatModel):  # type: ignore[misc,unused-ignore]  # Any without the extra
        """A fake chat model that replays our scripts (by assistant turn), like ScriptedModel."""

        agent: str = "chain"

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
            return self

        def _generate(
            self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
        ) -> ChatResult:
            user = next(m for m in messages if isinstance(m, HumanMessage))
            turn = sum(1 for m in messages if isinstance(m, AIMessage))
            response = _script_reply(self.agent, str(user.content), turn)
            message = AIMessage(
                content=response.text or "",
                tool_calls=[
                    {"name": c.name, "args": c.arguments, "id": c.id or f"call_{i}", "type": "tool_call"}
                    for i, c in enumerate(response.tool_calls)
                ],
            )
            return ChatResult(generations=[ChatGeneration(message=message)])

    def as_langchain(tool: Any) -> Any:
        def run(**kwargs: Any) -> str:
            return str(tool.invoke(tool.validate(kwargs), _ctx("lg", 0, "lg")))

        return StructuredTool.from_function(
            func=run, name=tool.name, description=tool.description, args_schema=tool.args_model
        )

    tools = [as_langchain(t) for t in TOOLS]
    models: dict[str, Any] = {}

    def model_for(agent: str) -> Any:
        if agent not in models:
            models[agent] = ScriptedChatModel(agent=agent).bind_tools(tools)
        return models[agent]

    def agent_node(state: MessagesState) -> dict[str, Any]:
        # The system prompt names the agent ("benchmark agent NAME"), as it does on the workers.
        messages = state["messages"]
        agent = str(messages[0].content).rpartition(" ")[2]
        return {"messages": [model_for(agent).invoke(messages)]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent_node)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    compiled: Any = graph.compile(checkpointer=checkpointer)  # invoke() is typed for the state schema

    def invoke(agent: str, text: str, config: dict[str, Any]) -> Any:
        return compiled.invoke(
            {"messages": [("system", f"benchmark agent {agent}"), ("user", text)]},
            config={**config, "recursion_limit": 10_000},
        )

    return invoke


class LangGraphPeer:
    """One compiled graph per checkpointer kind.

    * ``none``: no checkpointer;
    * ``memory``: ``InMemorySaver``;
    * ``sqlite``: ``SqliteSaver`` on a file, SQLite's defaults (rollback journal, synchronous=FULL:
      every checkpoint write waits for an fsync);
    * ``sqlite-wal``: the same file-backed saver with ``journal_mode=WAL, synchronous=NORMAL``
      (no fsync per commit: what a Redis without per-write fsync, as benchmarked here, compares to).
    """

    def __init__(self, checkpointer: str) -> None:
        self.kind = checkpointer
        self._conn: sqlite3.Connection | None = None
        self._dir: str | None = None
        saver: Any = None
        if checkpointer == "memory":
            from langgraph.checkpoint.memory import InMemorySaver

            saver = InMemorySaver()
        elif checkpointer in ("sqlite", "sqlite-wal"):
            from langgraph.checkpoint.sqlite import SqliteSaver

            self._dir = tempfile.mkdtemp(prefix="wesichain-lg-")
            self._conn = sqlite3.connect(str(Path(self._dir) / "checkpoints.db"), check_same_thread=False)
            if checkpointer == "sqlite-wal":
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute("PRAGMA synchronous=NORMAL")
            saver = SqliteSaver(self._conn)
            saver.setup()
        elif checkpointer != "none":
            raise ValueError(checkpointer)
        self._invoke = _build_langgraph(saver)

    def run(self, agent: str, text: str) -> tuple[str, int, int, float]:
        """One run on a fresh thread; returns (answer, model calls, nodes executed, seconds)."""
        config = {"configurable": {"thread_id": uuid.uuid4().hex}}
        started = time.perf_counter()
        state = self._invoke(agent, text, config)
        elapsed = time.perf_counter() - started
        messages = state["messages"]
        model_calls = sum(1 for m in messages if m.type == "ai")
        tool_nodes = sum(1 for m in messages if m.type == "ai" and m.tool_calls)
        return str(messages[-1].content), model_calls, model_calls + tool_nodes, elapsed

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._dir is not None:
            import shutil

            shutil.rmtree(self._dir, ignore_errors=True)
