"""pytest fixtures for testing your agents: the ``wesichain`` pytest plugin.

Installing ``wesichain`` registers this module with pytest (entry point ``pytest11``), so any
test can ask for these fixtures::

    # pyproject.toml
    [tool.pytest.ini_options]
    wesichain_agents_module = "myagents"

    # test_support.py
    from shared.llm.scripted import reply

    def test_refund(wesichain_scripted, wesichain_run):
        wesichain_scripted("support", [reply(None, ("refund", {"order_id": "A7", "cents": 500})), "Done."])
        run = wesichain_run("support", "Refund order A7")
        run.assert_completed("Done.")
        run.assert_tool_calls([("refund", {"order_id": "A7", "cents": 500})])
        run.assert_invariants()

Runs go through the embedded mode: the same phase tasks, scripts and state as a deployment, on an
in-memory broker, an in-process Redis stand-in and an in-process worker, started for each test
that asks for it. A test that uses none of these fixtures imports and starts nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import pytest

if TYPE_CHECKING:
    from producer.client import Client, RunHandle
    from shared.agents import AgentRegistry
    from shared.events import Event
    from shared.llm.base import ModelResponse
    from shared.messages import Message
    from shared.state import Phase, RunHead

    #: A scripted reply: a ModelResponse (``shared.llm.scripted.reply(...)``) or just an answer's text.
    Reply: TypeAlias = ModelResponse | str
    #: What a scripted model says: one reply per model turn, in order, or a function of the conversation.
    Script: TypeAlias = Sequence[Reply] | Callable[[Sequence[Message]], Reply]

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "INI_AGENTS_MODULE",
    "RunAgent",
    "ScriptedModels",
    "WesichainRun",
    "assert_event_invariants",
    "event_kinds",
    "pytest_addoption",
    "tool_calls",
    "wesichain_agents_module",
    "wesichain_client",
    "wesichain_run",
    "wesichain_scripted",
]

INI_AGENTS_MODULE = "wesichain_agents_module"
#: How long ``wesichain_run`` waits for a run's end unless told otherwise, in seconds.
DEFAULT_TIMEOUT_S = 30.0
#: Events that belong to a step, so come after its StepStarted.
_STEP_EVENTS = ("ModelResponded", "ToolDispatched", "ToolCompleted", "StepFailed", "Completed", "Failed")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        INI_AGENTS_MODULE,
        "agents module the embedded worker of the wesichain_* fixtures loads"
        " (default: $WESICHAIN_AGENTS, else the research demo)",
        type="string",
        default="",
    )


def _embedded(agents_module: str | None) -> AbstractContextManager[Client]:
    from worker.embedded import embedded  # the plugin's only reference to the embedded mode

    return embedded(agents_module)


# -- reading and asserting on a run's events ----------------------------------------------------


def event_kinds(events: Iterable[Event]) -> list[str]:
    """The kinds of the committed events, in order (live ``TokenDelta`` and custom events left out)."""
    from shared.events import LIVE_EVENTS

    return [e.kind for e in events if e.kind not in LIVE_EVENTS]


def tool_calls(events: Iterable[Event]) -> list[tuple[str, dict[str, Any]]]:
    """``(tool, arguments)`` of every tool call the run dispatched, in dispatch order."""
    return [(e.tool, e.arguments) for e in events if e.kind == "ToolDispatched"]


def assert_event_invariants(events: Sequence[Event]) -> None:
    """Fail unless the events keep the runtime's invariants.

    Each step starts once and before anything else of that step; every ``ToolDispatched`` has
    exactly one ``ToolCompleted``; there is exactly one end event (``Completed``, ``Failed`` or
    ``Interrupted``) and nothing is committed after it.
    """
    __tracebackhide__ = True
    from shared.events import END_EVENTS, LIVE_EVENTS

    committed = [e for e in events if e.kind not in LIVE_EVENTS]
    started: set[int] = set()
    for e in committed:
        if e.kind == "StepStarted":
            if e.step in started:
                raise AssertionError(f"step {e.step} started twice: {_kinds_line(committed)}")
            started.add(e.step)
        elif e.kind in _STEP_EVENTS and e.step > 0 and e.step not in started:
            raise AssertionError(f"{e.kind} of step {e.step} before its StepStarted: {_kinds_line(events)}")
    dispatched = [(e.step, e.call_id, e.tool) for e in committed if e.kind == "ToolDispatched"]
    completed = [(e.step, e.call_id, e.tool) for e in committed if e.kind == "ToolCompleted"]
    for label, calls in (("dispatched", dispatched), ("completed", completed)):
        twice = sorted({c for c in calls if calls.count(c) > 1})
        if twice:
            raise AssertionError(f"tool calls {label} more than once: {_calls_line(twice)}")
    if sorted(dispatched) != sorted(completed):
        missing = sorted(set(dispatched) - set(completed))
        unasked = sorted(set(completed) - set(dispatched))
        raise AssertionError(
            "every ToolDispatched needs exactly one ToolCompleted: never completed:"
            f" {_calls_line(missing)}; completed but never dispatched: {_calls_line(unasked)}"
        )
    ends = [e.kind for e in committed if e.kind in END_EVENTS]
    if len(ends) != 1:
        raise AssertionError(f"expected exactly one end event, got {len(ends)}: {_kinds_line(committed)}")
    if committed[-1].kind not in END_EVENTS:
        raise AssertionError(f"events go on after the {ends[0]} event: {_kinds_line(committed)}")


def _kinds_line(events: Iterable[Event]) -> str:
    return ", ".join(event_kinds(events)) or "(none)"


def _calls_line(calls: Iterable[tuple[int, str, str]]) -> str:
    return ", ".join(f"{tool} ({call_id}, step {step})" for step, call_id, tool in calls) or "none"


def _first_difference(expected: Sequence[object], actual: Sequence[object]) -> int:
    for i, (want, got) in enumerate(zip(expected, actual, strict=False)):
        if want != got:
            return i
    return min(len(expected), len(actual))


@dataclass(frozen=True)
class WesichainRun:
    """A finished run: its final state and every event it emitted, with assertions over them."""

    head: RunHead
    #: Every event in order, ``TokenDelta`` included.
    events: list[Event]

    @classmethod
    def collect(cls, handle: RunHandle, timeout: float = DEFAULT_TIMEOUT_S) -> WesichainRun:
        """Wait until the run is terminal (``RunTimeout`` after ``timeout`` s), then read its events."""
        head = handle.wait(timeout=timeout)
        events = list(handle.events(follow=True, idle_timeout=timeout))
        return cls(head=head, events=events)

    @property
    def run_id(self) -> str:
        return self.head.run_id

    @property
    def phase(self) -> Phase:
        return self.head.phase

    @property
    def answer(self) -> str | None:
        return self.head.answer

    @property
    def kinds(self) -> list[str]:
        """Kinds of the committed events in order (no ``TokenDelta``)."""
        return event_kinds(self.events)

    @property
    def tool_calls(self) -> list[tuple[str, dict[str, Any]]]:
        """``(tool, arguments)`` of every dispatched tool call, in dispatch order."""
        return tool_calls(self.events)

    @property
    def tool_results(self) -> list[tuple[str, bool, str]]:
        """``(tool, ok, output)`` of every completed tool call, in dispatch order."""
        done = {(e.step, e.call_id): e for e in self.events if e.kind == "ToolCompleted"}
        return [
            (c.tool, c.ok, c.output)
            for e in self.events
            if e.kind == "ToolDispatched" and (c := done.get((e.step, e.call_id))) is not None
        ]

    def assert_kinds(self, expected: Sequence[str]) -> None:
        """Fail unless the committed events' kinds are exactly ``expected``, in order."""
        __tracebackhide__ = True
        actual = self.kinds
        if actual != list(expected):
            at = _first_difference(expected, actual)
            want = expected[at] if at < len(expected) else "(end)"
            got = actual[at] if at < len(actual) else "(end)"
            raise AssertionError(
                f"run {self.run_id}: event kinds differ at #{at} (expected {want}, got {got})\n"
                f"  expected: {', '.join(expected)}\n"
                f"  actual:   {', '.join(actual)}"
            )

    def assert_tool_calls(self, expected: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
        """Fail unless the dispatched tool calls are exactly ``expected``: ``(tool, arguments)`` in order."""
        __tracebackhide__ = True
        want = [(tool, dict(arguments)) for tool, arguments in expected]
        actual = self.tool_calls
        if actual != want:
            at = _first_difference(want, actual)
            raise AssertionError(
                f"run {self.run_id}: tool calls differ at #{at}\n"
                f"  expected: {_call_list(want)}\n"
                f"  actual:   {_call_list(actual)}"
            )

    def assert_answer(self, expected: str) -> None:
        """Fail unless the run's final answer is exactly ``expected``."""
        __tracebackhide__ = True
        if self.answer != expected:
            raise AssertionError(
                f"run {self.run_id}: answer differs\n  expected: {expected!r}\n  actual:   {self.answer!r}"
            )

    def assert_completed(self, answer: str | None = None) -> None:
        """Fail unless the run completed (saying why it did not), and with ``answer`` when given."""
        __tracebackhide__ = True
        if self.phase.value != "completed":
            error = self.head.error
            why = f": {error.kind}: {error.message}" if error is not None else ""
            raise AssertionError(
                f"run {self.run_id} ended {self.phase.value}, not completed{why}\n"
                f"  events: {_kinds_line(self.events)}"
            )
        if answer is not None:
            self.assert_answer(answer)

    def assert_invariants(self) -> None:
        """Fail unless the events keep the runtime's invariants (see :func:`assert_event_invariants`)."""
        __tracebackhide__ = True
        assert_event_invariants(self.events)


def _call_list(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    return ", ".join(f"{tool}({dict(arguments)!r})" for tool, arguments in calls) or "(none)"


# -- scripted models ------------------------------------------------------------------------------


class ScriptedModels:
    """Scripted models registered for agents during one test (what ``wesichain_scripted`` gives).

    Call it with an agent's name and a script; runs of that agent started with ``wesichain_run``
    then ask the scripted model instead of the agent's own. With ``wesichain_client``, pass the
    returned model string as ``submit(..., model=...)``.
    """

    def __init__(self, registry: AgentRegistry) -> None:
        self._registry = registry
        self._names: list[str] = []
        self._by_agent: dict[str, str] = {}

    def __call__(self, agent: str, script: Script, *, latency_s: float = 0.0, chunk: int = 8) -> str:
        """Register a scripted model for ``agent``; return its model string (``scripted:NAME``).

        ``script`` is a list of replies, one per model turn (the first answers the user's input,
        the next one the tool results, ...), or a function of the conversation so far. A reply
        is ``shared.llm.scripted.reply(text, (tool, arguments), ...)`` or a plain answer string;
        the reply ``"!transport"`` is a retryable provider error. A run that asks for more turns
        than a list holds fails with a ``ModelTransport`` error.
        """
        from shared.llm.scripted import ScriptedModel

        self._registry.get(agent)  # an unknown agent fails here, naming the registered ones
        name = f"pytest-{agent}-{uuid.uuid4().hex[:8]}"
        if callable(script):
            function = script

            def scripted(messages: Sequence[Message]) -> ModelResponse:
                return _response(function(messages))

            model = ScriptedModel(scripted, latency_s=latency_s, chunk=chunk)
        else:
            model = ScriptedModel([_response(r) for r in script], latency_s=latency_s, chunk=chunk)
        self._registry.add_model(name, model)
        self._names.append(name)
        self._by_agent[agent] = f"scripted:{name}"
        return self._by_agent[agent]

    def model_for(self, agent: str) -> str | None:
        """The scripted model string registered for ``agent`` in this test, if any (the latest)."""
        return self._by_agent.get(agent)

    def remove_all(self) -> None:
        # The registry offers no public way to forget a model; these names are unique to this test.
        for name in self._names:
            self._registry.remove_model(name)
        self._names.clear()
        self._by_agent.clear()


def _response(reply: Reply) -> ModelResponse:
    from shared.llm.scripted import reply as make_reply

    return make_reply(reply) if isinstance(reply, str) else reply


# -- fixtures -------------------------------------------------------------------------------------


class RunAgent(Protocol):
    """The ``wesichain_run`` callable."""

    def __call__(
        self,
        agent: str,
        input: str,
        *,
        model: str | None = None,
        thread_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> WesichainRun: ...


@pytest.fixture
def wesichain_agents_module(request: pytest.FixtureRequest) -> str | None:
    """The agents module (``registry = AgentRegistry()``) the embedded worker loads, by import path.

    Read from the ``wesichain_agents_module`` ini option; when that is unset, ``None``: the
    ``WESICHAIN_AGENTS`` environment variable or the research demo, as for ``wesichain worker``.
    Override this fixture in a ``conftest.py`` to choose the module per directory or per test.
    """
    value = request.config.getini(INI_AGENTS_MODULE)
    return value if isinstance(value, str) and value else None


@pytest.fixture
def wesichain_client(wesichain_agents_module: str | None) -> Iterator[Client]:
    """A :class:`producer.client.Client` bound to an embedded worker that loads your agents.

    In-memory broker, in-process Redis stand-in and an in-process worker (a thread pool), started
    for the test and stopped after it. Use it for what ``wesichain_run`` does not cover: runs
    that park for approval, cancels, ``handle.events()`` while a run goes on.
    ``WesichainRun.collect(handle)`` turns any handle into an assertable record.
    """
    with _embedded(wesichain_agents_module) as client:
        yield client


@pytest.fixture
def wesichain_scripted(wesichain_client: Client) -> Iterator[ScriptedModels]:
    """Give an agent a scripted model for this test: ``wesichain_scripted(agent, script) -> model``.

    ``script`` is a list of replies (``reply(text, (tool, arguments), ...)`` or plain strings),
    one per model turn, or a function of the conversation returning one. ``wesichain_run`` runs
    the agent on it; the returned ``scripted:NAME`` string works as ``submit(..., model=...)``.
    The model is unregistered when the test ends.
    """
    from shared.agents import load_registry

    models = ScriptedModels(load_registry(wesichain_client.settings.agents_module))
    yield models
    models.remove_all()


@pytest.fixture
def wesichain_run(wesichain_client: Client, wesichain_scripted: ScriptedModels) -> RunAgent:
    """Run an agent to its end on the embedded worker: ``wesichain_run(agent, input) -> WesichainRun``.

    Submits the run (on the agent's scripted model, when the test registered one with
    ``wesichain_scripted``, unless ``model=`` says otherwise), waits until it is terminal
    (``RunTimeout`` after ``timeout`` seconds) and returns its final state and events, with
    ``assert_kinds``, ``assert_tool_calls``, ``assert_answer``, ``assert_completed`` and
    ``assert_invariants``.
    """

    def run(
        agent: str,
        input: str,
        *,
        model: str | None = None,
        thread_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> WesichainRun:
        handle = wesichain_client.submit(
            agent,
            input,
            thread_id=thread_id,
            metadata=metadata,
            model=model or wesichain_scripted.model_for(agent),
        )
        return WesichainRun.collect(handle, timeout=timeout)

    return run
