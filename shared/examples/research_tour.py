"""The agents of ``wesichain demo --tour``: a front desk that hands off to a research assistant
whose knowledge-base search reports each hit as it finds it, on scripted models that follow a
conversation across the runs of a thread.

The tour (``worker/demo_tour.py``) talks to a run while its search works: it *holds* that
search open (:data:`holds`, in process: the embedded pool runs in the tour's process) until it
has sent its message and submitted the thread's next question, so what happens never depends on
timing. A run nobody holds is never delayed, and a hold lets go by itself after
:data:`HOLD_LIMIT_S`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence

from shared.agents import Agent, AgentRegistry
from shared.handoffs import Handoff, handoff_tool_name, remove_tool_calls
from shared.llm.base import ModelResponse
from shared.llm.scripted import ScriptedModel, reply
from shared.messages import AssistantMessage, Message, ToolMessage, UserMessage
from shared.tools import Tool, ToolSet

__all__ = [
    "HOLD_LIMIT_S",
    "TOUR_DESK",
    "TOUR_DETOUR",
    "TOUR_FOLLOW_UP",
    "TOUR_NOTE",
    "TOUR_QUESTION",
    "TOUR_RESEARCH",
    "TOUR_SWITCH",
    "SearchHold",
    "SearchHolds",
    "holds",
    "register_tour",
]

TOUR_DESK = "research-tour-desk"
TOUR_RESEARCH = "research-tour"
#: The thread's first question, to the front desk.
TOUR_QUESTION = "What makes an agent run durable?"
#: The user's message into that run while its search works.
TOUR_NOTE = "Just the best match, please."
#: The second question, submitted under ``enqueue`` while the first run is still going.
TOUR_FOLLOW_UP = "And how does a lease work?"
#: The third, whose search the fourth question interrupts.
TOUR_DETOUR = "What is Flower?"
#: The fourth, under ``rollback`` while the third is in its search: it displaces the third.
TOUR_SWITCH = "Scratch that: what is an idempotency key?"

#: How long a held search waits at most: a hold nobody releases never keeps a worker for good.
HOLD_LIMIT_S = 60.0
#: Earlier user messages an answer recalls (the newest).
_RECALLED = 3


class SearchHold:
    """One run's search held open: ``reached`` once the search has reported its hits and waits,
    ``release`` lets it return."""

    def __init__(self) -> None:
        self._reached = threading.Event()
        self._released = threading.Event()

    def wait_reached(self, timeout: float) -> bool:
        """Whether the search reached the hold (every hit already reported) within ``timeout``."""
        return self._reached.wait(timeout)

    def release(self) -> None:
        self._released.set()

    def _wait(self) -> None:
        self._reached.set()
        self._released.wait(HOLD_LIMIT_S)


class SearchHolds:
    """The runs whose ``kb_search`` waits for the tour, by run id (in this process only)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, SearchHold] = {}

    def hold(self, run_id: str) -> SearchHold:
        """Hold the next search of run ``run_id`` (arm it before the run is submitted)."""
        with self._lock:
            return self._held.setdefault(run_id, SearchHold())

    def held(self) -> set[str]:
        """The runs held now."""
        with self._lock:
            return set(self._held)

    def forget(self, run_id: str) -> None:
        with self._lock:
            held = self._held.pop(run_id, None)
        if held is not None:
            held.release()

    def wait_if_held(self, run_id: str) -> None:
        """Called by the search once it reported its hits: waits while the tour holds the run."""
        with self._lock:
            held = self._held.get(run_id)
        if held is not None:
            held._wait()


#: The holds of this process, read by ``kb_search`` and armed by the tour.
holds = SearchHolds()


# -- scripted models ---------------------------------------------------------------------------


def _desk_script(messages: Sequence[Message]) -> ModelResponse:
    """The front desk hands every question to the research assistant."""
    return reply("Handing you to the research assistant.", (handoff_tool_name(TOUR_RESEARCH), {}))


def _quoted(texts: Sequence[str]) -> str:
    return "; ".join(json.dumps(t[:80], ensure_ascii=False) for t in texts)


def _research_script(messages: Sequence[Message]) -> ModelResponse:
    """Search for the newest question; then answer from the hits, heeding what the user added
    while the search worked, and recall what was asked earlier in the thread."""
    searches = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage) and m.tool_calls]
    answers = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage) and not m.tool_calls]
    users = [(i, m.content) for i, m in enumerate(messages) if isinstance(m, UserMessage)]
    searched = searches[-1] if searches else -1
    results = [m for m in messages[searched + 1 :] if isinstance(m, ToolMessage)]
    if searched < (answers[-1] if answers else -1) or not results:
        question = users[-1][1] if users else ""
        return reply(None, ("kb_search", {"query": question, "limit": 2}))
    asked_at = max((i for i, _ in users if i < searched), default=-1)
    notes = [text for i, text in users if i > searched]
    earlier = [text for i, text in users if i < asked_at][-_RECALLED:]
    hits = [] if results[0].is_error else json.loads(results[0].content)["hits"]
    if not hits:
        answer = "Nothing in the knowledge base about that."
    elif notes:
        answer = (
            f"You added {_quoted(notes)}, so the best match only: {hits[0]['title']}: {hits[0]['snippet']}"
        )
    else:
        answer = f"{hits[0]['title']}: {hits[0]['snippet']}"
        if others := [h["title"] for h in hits[1:]]:
            answer += f" (See also: {', '.join(others)}.)"
    if earlier:
        answer += f" (Earlier in this thread: {_quoted(earlier)}.)"
    return reply(answer)


def register_tour(registry: AgentRegistry, kb_search: Tool) -> None:
    """Add the tour's front desk, its research assistant and their scripted models to ``registry``."""
    registry.add_model(TOUR_DESK, ScriptedModel(_desk_script, chunk=16))
    registry.add_model(TOUR_RESEARCH, ScriptedModel(_research_script, chunk=16))
    registry.add(
        Agent(
            name=TOUR_RESEARCH,
            model=f"scripted:{TOUR_RESEARCH}",
            system_prompt=(
                "You are a careful research assistant. Use `kb_search` for facts from the knowledge"
                " base; heed what the user adds while you work."
            ),
            tools=ToolSet([kb_search]),
            max_steps=4,
        )
    )
    registry.add(
        Agent(
            name=TOUR_DESK,
            model=f"scripted:{TOUR_DESK}",
            system_prompt="You are the front desk. Hand research questions to the research assistant.",
            handoffs=(
                Handoff(
                    TOUR_RESEARCH,
                    description="Hand over to the research assistant.",
                    input_filter=remove_tool_calls,
                ),
            ),
            max_steps=2,
        )
    )
