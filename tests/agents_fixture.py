"""Agents the integration and chaos tests run on real workers (imported by path, like any agents module).

Tools record their side effects in the test's Redis (``HINCRBY test:effects <idempotency key>``),
so tests can count how many times an effect really happened.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import redis
from pydantic import BaseModel, Field

from shared.agents import Agent, AgentRegistry
from shared.errors import ModelTransport
from shared.llm.base import ModelRequest, ModelResponse, RawToolCall, StreamPart, TextDelta, Usage
from shared.llm.scripted import ScriptedModel, reply
from shared.messages import AssistantMessage, Message, ToolMessage, UserMessage
from shared.policy import Fail, Interrupt, Policy, Reprompt, Retry
from shared.tools import ToolContext, ToolSet, tool
from tests.broker import redis_from_env

EFFECTS_KEY = "test:effects"
STARTS_KEY = "test:starts"
#: idempotency key -> pid of the process that last started the call (chaos tests kill it).
PIDS_KEY = "test:pids"
#: List per idempotency key: the pid of every attempt of the poison tool, appended before it dies.
ATTEMPT_PIDS_KEY = "test:attempt_pids:"


@cache
def _redis() -> redis.Redis:
    return redis_from_env()


def _record(key: str, ctx: ToolContext) -> None:
    if key == STARTS_KEY:
        _redis().hset(PIDS_KEY, ctx.idempotency_key, os.getpid())
    _redis().hincrby(key, ctx.idempotency_key, 1)


class AddArgs(BaseModel):
    a: float
    b: float


@tool
def add(args: AddArgs, ctx: ToolContext) -> float:
    """Add two numbers (records one effect per call)."""
    _record(EFFECTS_KEY, ctx)
    return args.a + args.b


class SleepArgs(BaseModel):
    seconds: float = Field(ge=0, le=60)
    label: str = ""


class SleepResult(BaseModel):
    label: str
    pid: int


@tool
def slow(args: SleepArgs, ctx: ToolContext) -> SleepResult:
    """Sleep cooperatively (stops early when the run is cancelled) and report which process ran it."""
    _record(STARTS_KEY, ctx)
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        if ctx.cancelled():
            break
        time.sleep(0.02)
    _record(EFFECTS_KEY, ctx)
    return SleepResult(label=args.label, pid=os.getpid())


#: String per run: set by a test to let the run's ``held`` or ``hold`` call return.
RELEASE_KEY = "test:release:"


@tool
def held(args: SleepArgs, ctx: ToolContext) -> SleepResult:
    """A retry-safe call that runs until the test releases it: a test that acts "while the call
    runs" then never depends on how long its own steps take on a loaded machine."""
    _record(STARTS_KEY, ctx)
    deadline = time.monotonic() + args.seconds
    while not _redis().exists(RELEASE_KEY + ctx.run_id) and time.monotonic() < deadline:
        if ctx.cancelled():
            break
        time.sleep(0.02)
    _record(EFFECTS_KEY, ctx)
    return SleepResult(label=args.label, pid=os.getpid())


@tool(retry_safe=False)
def charge(args: SleepArgs, ctx: ToolContext) -> SleepResult:
    """A side effect that must never happen twice (think: a payment)."""
    _record(STARTS_KEY, ctx)
    time.sleep(args.seconds)
    _record(EFFECTS_KEY, ctx)
    return SleepResult(label=args.label, pid=os.getpid())


#: Directory of the gated charge (``charge_gated``): its counts and the gate it waits for.
GATE_DIR_ENV = "WESICHAIN_TEST_GATE_DIR"


def _count(name: str) -> None:
    """One more line in ``name`` under the gate directory: counts kept outside Redis, so they are
    written even while Redis refuses every write."""
    with open(os.path.join(os.environ[GATE_DIR_ENV], name), "a") as f:
        f.write(f"{os.getpid()}\n")


def gated_count(gate: Path, name: str) -> int:
    """How many times ``name`` was counted under the gate directory ``gate`` (:func:`_count`)."""
    path = gate / name
    return len(path.read_text().splitlines()) if path.exists() else 0


def _until_the_gate_opens(seconds: float, stop: Callable[[], bool] = lambda: False) -> None:
    """Hold until the test opens the gate (a file ``open`` under the gate directory), ``stop``
    says so, or ``seconds`` passed."""
    gate = os.path.join(os.environ[GATE_DIR_ENV], "open")
    deadline = time.monotonic() + seconds
    while not os.path.exists(gate) and time.monotonic() < deadline and not stop():
        time.sleep(0.02)


@tool(retry_safe=False)
def charge_gated(args: SleepArgs, ctx: ToolContext) -> SleepResult:
    """A non-retry-safe effect that starts, then ends only once the test opens its gate (a file),
    counting its starts and effects in files rather than in Redis."""
    _count(f"{ctx.idempotency_key}.starts")
    _until_the_gate_opens(args.seconds)
    _count(f"{ctx.idempotency_key}.effects")
    return SleepResult(label=args.label, pid=os.getpid())


@tool
def slow_gated(args: SleepArgs, ctx: ToolContext) -> SleepResult:
    """The retry-safe twin of ``charge_gated``: runs until the test opens the gate, counting its
    starts and effects in files, so it runs on through a Redis outage and past Redis's return."""
    _count(f"{ctx.idempotency_key}.starts")
    _until_the_gate_opens(args.seconds, ctx.cancelled)
    _count(f"{ctx.idempotency_key}.effects")
    return SleepResult(label=args.label, pid=os.getpid())


def gated_thinks(run_input: str) -> str:
    """The file (under the gate directory) counting the calls of ``think_gated``'s model for the
    run whose input is ``run_input``."""
    return f"{run_input}.thinks"


def _think_until_the_gate_opens(messages: Sequence[Message]) -> ModelResponse:
    """A model call that counts itself, then holds (up to 60 s) until the test opens the gate:
    a think in flight through a Redis outage, its counts kept outside Redis."""
    run_input = next(m.content for m in messages if isinstance(m, UserMessage))
    _count(gated_thinks(run_input))
    _until_the_gate_opens(60)
    return reply("thought through the outage")


class NoArgs(BaseModel):
    pass


@tool
def crash_worker(args: NoArgs, ctx: ToolContext) -> str:
    """A poison tool: kills the process that runs it, every time (recording which process first)."""
    _record(STARTS_KEY, ctx)
    _redis().rpush(ATTEMPT_PIDS_KEY + ctx.idempotency_key, os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@tool
def boom(args: NoArgs) -> str:
    """A tool that always raises."""
    raise RuntimeError("boom: the tool failed")


class HoldArgs(BaseModel):
    seconds: float = Field(ge=0, le=3600)


def _sleep_holding_the_gil(seconds: float) -> None:
    """Sit in C code for ``seconds`` without releasing the GIL and deaf to SIGALRM.

    libc's sleep through ``ctypes.PyDLL`` is a C call made with the GIL held, so no other thread of
    the process (the heartbeat included) runs meanwhile; SIGALRM is blocked first, as some C
    libraries do, so no timer interrupts it either. Only killing the process ends it early.
    """
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        ctypes.PyDLL(None).sleep(int(seconds))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


@tool(retry_safe=False)
def charge_holding_gil(args: HoldArgs, ctx: ToolContext) -> str:
    """A non-retry-safe side effect stuck in C code that holds the GIL (think: a blocking C driver)."""
    _record(STARTS_KEY, ctx)
    _sleep_holding_the_gil(args.seconds)
    _record(EFFECTS_KEY, ctx)
    return "charged while holding the GIL"


@tool(timeout_s=1.0)
def swallow_timeout(args: HoldArgs, ctx: ToolContext) -> str:
    """A tool that runs far past its 1 s timeout and catches every Exception on the way."""
    _record(STARTS_KEY, ctx)
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        try:
            time.sleep(0.05)
        except Exception:  # the kind of blanket handler real tools have
            pass
    _record(EFFECTS_KEY, ctx)
    return "finished long after the timeout"


@tool(timeout_s=1.0)
def hang_in_c(args: HoldArgs, ctx: ToolContext) -> str:
    """A tool stuck in C code past its 1 s timeout: only killing its process stops it."""
    _record(STARTS_KEY, ctx)
    _sleep_holding_the_gil(args.seconds)
    _record(EFFECTS_KEY, ctx)
    return "came back from C"


@tool(retry_safe=False, timeout_s=1.0)
def charge_hang_in_c(args: HoldArgs, ctx: ToolContext) -> str:
    """A non-retry-safe side effect stuck in C code past its 1 s timeout."""
    _record(STARTS_KEY, ctx)
    _sleep_holding_the_gil(args.seconds)
    _record(EFFECTS_KEY, ctx)
    return "charged after hanging"


class ProgressArgs(BaseModel):
    steps: int = Field(ge=0, le=50)
    #: The first attempt of the call waits this long after its events (a test kills it meanwhile).
    hold_s: float = Field(default=0, ge=0, le=60)


#: idempotency key -> pid of the first attempt of a ``progress`` call (the one that may hold).
PROGRESS_FIRST_KEY = "test:progress_first"


@tool
def progress(args: ProgressArgs, ctx: ToolContext) -> str:
    """Report ``steps`` progress events (retry-safe); its first attempt may then hold, to be killed."""
    first = bool(_redis().hsetnx(PROGRESS_FIRST_KEY, ctx.idempotency_key, os.getpid()))
    for done in range(1, args.steps + 1):
        ctx.emit("progress", {"done": done, "of": args.steps, "pid": os.getpid()})
    _record(STARTS_KEY, ctx)  # after the events: a test that saw the start sees every event
    if first and args.hold_s:
        deadline = time.monotonic() + args.hold_s
        while time.monotonic() < deadline and not ctx.cancelled():
            time.sleep(0.02)
    _record(EFFECTS_KEY, ctx)
    return f"{args.steps} steps done"


TOOLS = ToolSet(
    [
        add,
        progress,
        slow,
        held,
        charge,
        charge_gated,
        slow_gated,
        crash_worker,
        boom,
        charge_holding_gil,
        swallow_timeout,
        hang_in_c,
        charge_hang_in_c,
    ]
)
registry = AgentRegistry()


def _add(name: str, script: Sequence[ModelResponse], **kwargs: Any) -> None:
    registry.add_model(name, ScriptedModel(script))
    registry.add(
        Agent(name=name, model=f"scripted:{name}", system_prompt=f"test agent {name}", tools=TOOLS, **kwargs)
    )


def _raw(name: str, arguments: object) -> ModelResponse:
    raw: Any = arguments  # deliberately malformed model output
    return ModelResponse(tool_calls=[RawToolCall(id="c1", name=name, arguments=raw)], usage=Usage())


_add("direct", [reply("The answer is 42.")])
_add("one_hop", [reply(None, ("add", {"a": 1, "b": 2})), reply("1 + 2 = 3")])
_add(
    "chain",
    [
        reply(None, ("add", {"a": 1, "b": 2})),
        reply(None, ("add", {"a": 3, "b": 4})),
        reply(None, ("add", {"a": 5, "b": 6})),
        reply("done after three hops"),
    ],
)
_add(
    "parallel",
    [
        reply(None, *[("slow", {"seconds": 1.0, "label": f"p{i}"}) for i in range(4)]),
        reply("all four done"),
    ],
)
_add("progress", [reply(None, ("progress", {"steps": 5})), reply("progress reported")])
#: Its call's first attempt emits, then holds for 30 s: a chaos test kills it there.
_add("progress_held", [reply(None, ("progress", {"steps": 3, "hold_s": 30})), reply("progress reported")])
_add("unknown_tool", [_raw("does_not_exist", "{}")])
_add("bad_json", [_raw("add", '{"a": 1, "b": ')])
_add("bad_args", [_raw("add", {"a": "one", "b": 2})])
_add(
    "reprompt",
    [_raw("add", {"a": "one"}), reply(None, ("add", {"a": 1, "b": 1})), reply("fixed it: 2")],
    policy=Policy(on_invalid_action=Reprompt(n=1)),
)
_add("interrupt_on_invalid", [_raw("nope", "{}")], policy=Policy(on_invalid_action=Interrupt()))
_add("tool_error_continue", [reply(None, ("boom", {})), reply("recovered from the tool error")])
_add("tool_error_fail", [reply(None, ("boom", {}))], policy=Policy(on_tool_error="fail_fast"))
_add("budget", [reply(None, ("add", {"a": 1, "b": 1}))] * 5, max_steps=2)
_add("long_tool", [reply(None, ("slow", {"seconds": 30, "label": "long"})), reply("should not get here")])
_add("poison", [reply(None, ("crash_worker", {})), reply("unreachable")])
_add("charge_once", [reply(None, ("charge", {"seconds": 3, "label": "pay"})), reply("charged")])
_add("slow_step", [reply(None, ("slow", {"seconds": 3, "label": "s"})), reply("slow step done")])
#: A non-retry-safe call that waits (up to 60 s) for the test to open its gate.
_add("charge_gated", [reply(None, ("charge_gated", {"seconds": 60, "label": "pay"})), reply("charged")])
#: A retry-safe call that waits (up to 60 s) for the test to open its gate.
_add("slow_gated", [reply(None, ("slow_gated", {"seconds": 60, "label": "s"})), reply("slow step done")])
registry.add_model("think_gated", ScriptedModel(_think_until_the_gate_opens))
registry.add(
    Agent(name="think_gated", model="scripted:think_gated", system_prompt="think_gated", tools=TOOLS)
)
# Mid-call for long enough that a fault started right after the tool began (a rabbitmqctl call
# takes seconds on a loaded machine) still finds it running.
_add("slower_step", [reply(None, ("slow", {"seconds": 10, "label": "s"})), reply("slow step done")])
_add("model_retry_fail", [reply("!transport")], policy=Policy(on_model_error=Retry(n=2)))
_add("model_fail", [reply("!transport")], policy=Policy(on_model_error=Fail()))


def _echo_conversation(messages: Sequence[Message]) -> ModelResponse:
    """Answers with how many tool results it has seen, so threads and history are observable."""
    seen = sum(1 for m in messages if isinstance(m, ToolMessage))
    return reply(f"seen {seen} tool results in {len(messages)} messages")


registry.add_model("echo", ScriptedModel(_echo_conversation))
registry.add(Agent(name="echo", model="scripted:echo", system_prompt="echo", tools=TOOLS))


def _charge_on_each_message(messages: Sequence[Message]) -> ModelResponse:
    """A gated, non-retry-safe charge for each new user message (whatever history a thread gave it)."""
    if isinstance(messages[-1], UserMessage):
        return reply(None, ("charge_gated", {"seconds": 60, "label": "pay"}))
    return reply("charged")


registry.add_model("thread_charge", ScriptedModel(_charge_on_each_message))
registry.add(Agent(name="thread_charge", model="scripted:thread_charge", system_prompt="charge", tools=TOOLS))


# -- approvals -------------------------------------------------------------------------------------


def _after_review(messages: Sequence[Message]) -> ModelResponse:
    """Ask for a charge; then report what the reviewer decided, from the tool message it got."""
    results = [m for m in messages if isinstance(m, ToolMessage)]
    if not results:
        return reply(None, ("charge", {"seconds": 0, "label": "refund"}))
    last = results[-1]
    return reply(f"{'denied' if last.is_error else 'charged'}: {last.content}")


registry.add_model("needs_approval", ScriptedModel(_after_review))
registry.add(
    Agent(
        name="needs_approval",
        model="scripted:needs_approval",
        system_prompt="approval test agent",
        tools=TOOLS,
        approval_required=frozenset({"charge"}),
    )
)
registry.add(
    Agent(
        name="charge_park_unknown",
        model="scripted:charge_once",
        system_prompt="a non-retry-safe tool whose unknown outcome parks the run",
        tools=TOOLS,
        policy=Policy(on_unknown_outcome="await_approval"),
    )
)


# -- agents of the chaos suite (tests/chaos) ------------------------------------------------------

#: Step 1 a quick tool, step 2 a call held until the test releases the run (``RELEASE_KEY``):
#: old deliveries of step 1 are replayed while step 2 runs, however slow the machine.
_add(
    "late_delivery",
    [
        reply(None, ("add", {"a": 1, "b": 2})),
        reply(None, ("held", {"seconds": 60, "label": "late"})),
        reply("late deliveries changed nothing"),
    ],
)
#: Retry-safe and non-retry-safe tools in one run: two parallel calls, then a payment.
_add(
    "mixed",
    [
        reply(None, ("add", {"a": 2, "b": 2}), ("slow", {"seconds": 0.5, "label": "m"})),
        reply(None, ("charge", {"seconds": 1, "label": "pay"})),
        reply("mixed done"),
    ],
)


# -- agents of the reliability tests ----------------------------------------------------------------

#: Model calls per (run input, turn), counted by the models below: tests submit a unique input.
MODEL_CALLS_KEY = "test:model_calls"


def _count_call(messages: Sequence[Message]) -> int:
    """Count this model call under (the run's input, the turn); returns the count so far."""
    user = next(m.content for m in messages if isinstance(m, UserMessage))
    turn = sum(1 for m in messages if isinstance(m, AssistantMessage))
    return int(_redis().hincrby(MODEL_CALLS_KEY, f"{user}:{turn}", 1))


def _counted(messages: Sequence[Message]) -> ModelResponse:
    """One tool hop like one_hop, counting every model call."""
    _count_call(messages)
    if not any(isinstance(m, ToolMessage) for m in messages):
        return reply(None, ("add", {"a": 1, "b": 2}))
    return reply("1 + 2 = 3")


registry.add_model("counted", ScriptedModel(_counted))
registry.add(Agent(name="counted", model="scripted:counted", system_prompt="counted", tools=TOOLS))

#: Fails this many times (a retryable provider error), then answers.
FLAKY_FAILURES = 7


def _flaky(messages: Sequence[Message]) -> ModelResponse:
    if _count_call(messages) <= FLAKY_FAILURES:
        return reply("!transport")
    return reply("answered after the provider recovered")


registry.add_model("flaky", ScriptedModel(_flaky))
registry.add(
    Agent(
        name="flaky",
        model="scripted:flaky",
        system_prompt="flaky",
        tools=TOOLS,
        policy=Policy(on_model_error=Retry(n=FLAKY_FAILURES + 1, backoff_s=0.0)),
    )
)

#: Step 1 charges (quick) beside a slow call, so the run stays at that step after the charge.
_add(
    "charge_beside_slow",
    [
        reply(None, ("charge", {"seconds": 0.2, "label": "pay"}), ("slow", {"seconds": 4, "label": "s"})),
        reply("charged beside a slow call"),
    ],
)
_add("backlog", [reply(None, ("slow", {"seconds": 0.05, "label": "b"})), reply("through the backlog")])
_add("gil_charge", [reply(None, ("charge_holding_gil", {"seconds": 6})), reply("unreachable")])
_add(
    "swallowing",
    [reply(None, ("swallow_timeout", {"seconds": 600})), reply("went on without the tool")],
)
_add("hanging", [reply(None, ("hang_in_c", {"seconds": 600})), reply("went on without the tool")])
_add("charge_hanging", [reply(None, ("charge_hang_in_c", {"seconds": 600})), reply("unreachable")])

#: A model that takes this long to answer, with and without streaming (cancel tests).
SLOW_MODEL_S = 30.0
for _name, _stream in (("slow_answer", False), ("slow_answer_stream", True)):
    registry.add_model(_name, ScriptedModel([reply("too late")], latency_s=SLOW_MODEL_S))
    registry.add(
        Agent(name=_name, model=f"scripted:{_name}", system_prompt="slow", tools=TOOLS, stream=_stream)
    )

#: The ``dripping`` agent's model streams a piece of text every DRIP_GAP_S, DRIP_PIECES of them (a
#: minute) before it answers: a cancel lands mid-stream, with pieces still arriving.
DRIP_GAP_S = 0.01
DRIP_PIECES = 6000


class DrippingModel(ScriptedModel):
    """A model whose streamed answer comes slowly, a short piece at a time, as a provider's does."""

    def __init__(self, pieces: int, gap_s: float, pad: int = 0) -> None:
        super().__init__([reply("dripped")])
        self.pieces, self.gap_s, self.pad = pieces, gap_s, pad

    def stream(self, request: ModelRequest) -> Iterator[StreamPart]:
        for i in range(self.pieces):
            time.sleep(self.gap_s)  # the provider's pace
            yield TextDelta(text=f"piece {i}. " + "~" * self.pad)
        yield reply("dripped")


registry.add_model("dripping", DrippingModel(DRIP_PIECES, DRIP_GAP_S))
registry.add(
    Agent(name="dripping", model="scripted:dripping", system_prompt="drip", tools=TOOLS, stream=True)
)

#: The ``drip_short`` agent's model streams DRIP_SHORT_PIECES pieces the same way (``piece 0. ``,
#: ``piece 1. ``...; a couple of seconds): a follower's stream is cut at a chosen piece's delta
#: while the run still streams.
DRIP_SHORT_PIECES = 200
registry.add_model("drip_short", DrippingModel(DRIP_SHORT_PIECES, DRIP_GAP_S))
registry.add(
    Agent(name="drip_short", model="scripted:drip_short", system_prompt="drip", tools=TOOLS, stream=True)
)
#: The ``drip_wide`` agent's pieces are 2,500 characters each: about a megabyte of deltas over a
#: few seconds, far past the receive window of a follower that stops reading.
registry.add_model("drip_wide", DrippingModel(DRIP_SHORT_PIECES * 2, DRIP_GAP_S, pad=2_490))
registry.add(
    Agent(name="drip_wide", model="scripted:drip_wide", system_prompt="drip", tools=TOOLS, stream=True)
)


# -- custom run state ------------------------------------------------------------------------------


class Notebook(BaseModel):
    """The run state of the ``notebook`` agent: what its tool noted, and how many times."""

    notes: list[str] = Field(default_factory=list)
    count: int = Field(default=0, ge=0)


class NoteArgs(BaseModel):
    text: str
    count: int | None = None  # set the count to this (a negative one is refused by the state)


@tool
def note(args: NoteArgs, ctx: ToolContext) -> str:
    """Append a note to the run's state."""
    assert isinstance(ctx.state, Notebook)
    count = args.count if args.count is not None else ctx.state.count + 1
    ctx.update_state(notes=[*ctx.state.notes, args.text], count=count)
    return f"noted {args.text!r}"


registry.add_model(
    "notebook",
    ScriptedModel(
        [
            reply(None, ("note", {"text": "first"})),
            reply(None, ("note", {"text": "a"}), ("note", {"text": "b"})),
            reply(None, ("note", {"text": "bad", "count": -1})),
            reply("three notes"),
        ]
    ),
)
registry.add(
    Agent(
        name="notebook",
        model="scripted:notebook",
        system_prompt="keeps notes",
        tools=ToolSet([note]),
        state_type=Notebook,
    )
)


# -- a provider error that quotes the conversation -------------------------------------------------


def _echoing_400(messages: Sequence[Message]) -> ModelResponse:
    """A provider's 400 whose message echoes the user's prompt, as real providers' errors do."""
    prompt = next(m.content for m in messages if isinstance(m, UserMessage))
    raise ModelTransport(
        f"400 invalid request: could not process {prompt!r}", status_code=400, retryable=False
    )


registry.add_model("echoing_400", ScriptedModel(_echoing_400))
registry.add(
    Agent(
        name="echoing_400",
        model="scripted:echoing_400",
        system_prompt="fails with a provider error quoting the prompt",
        tools=TOOLS,
        policy=Policy(on_model_error=Fail()),
    )
)


# -- text repeated as it came: through a tool into the answer --------------------------------------


class RepeatArgs(BaseModel):
    text: str


@tool
def repeat(args: RepeatArgs) -> str:
    """Return the text it was given, as it is."""
    return args.text


def _repeat_prompt(messages: Sequence[Message]) -> ModelResponse:
    """Pass the user's prompt through the ``repeat`` tool, then answer with the tool's output."""
    if isinstance(messages[-1], ToolMessage):
        return reply(f"you said: {messages[-1].content}")
    prompt = next(m.content for m in messages if isinstance(m, UserMessage))
    return reply(None, ("repeat", {"text": prompt}))


registry.add_model("repeat_prompt", ScriptedModel(_repeat_prompt))
registry.add(
    Agent(
        name="repeat_prompt",
        model="scripted:repeat_prompt",
        system_prompt="repeats the prompt",
        tools=ToolSet([repeat]),
    )
)


# -- answers cut at the output token limit ---------------------------------------------------------

CUT_ANSWER = "The three reasons are: first, the lease; second, the"
WHOLE_ANSWER = "Three reasons: the lease, the claim and the sweeper."


def _cut_until_told(messages: Sequence[Message]) -> ModelResponse:
    """Cut at the output limit, until the conversation says the answer was cut off."""
    if any(isinstance(m, UserMessage) and "cut off" in m.content for m in messages):
        return reply(WHOLE_ANSWER)
    return ModelResponse(
        text=CUT_ANSWER, finish_reason="length", truncated=True, usage=Usage(output_tokens=16)
    )


_CUT_POLICIES: dict[str, Policy] = {
    "cut_accept": Policy(),  # the default: accept, recorded as truncated
    "cut_reprompt": Policy(on_truncated="reprompt"),
    "cut_fail": Policy(on_truncated="fail"),
}
for _name, _policy in _CUT_POLICIES.items():
    registry.add_model(_name, ScriptedModel(_cut_until_told))
    registry.add(
        Agent(
            name=_name,
            model=f"scripted:{_name}",
            system_prompt="answers cut at the output limit",
            tools=TOOLS,
            policy=_policy,
        )
    )


# -- signals: messages and state updates sent into a running run ------------------------------------

#: String per run: the pid of the process whose ``hold`` call is waiting.
HOLDING_KEY = "test:holding:"


class ReleaseArgs(BaseModel):
    label: str = ""


@tool
def hold(args: ReleaseArgs, ctx: ToolContext) -> str:
    """Wait until the test releases the run (so signals can be sent while a tool runs)."""
    _redis().set(HOLDING_KEY + ctx.run_id, os.getpid(), ex=3600)
    deadline = time.monotonic() + 120
    while not _redis().exists(RELEASE_KEY + ctx.run_id):
        if time.monotonic() > deadline:
            raise TimeoutError("never released")
        time.sleep(0.02)
    return "released"


class Inbox(BaseModel):
    priority: int = Field(default=0, ge=0, le=10)
    tags: list[str] = []


def heard(messages: Sequence[Message]) -> list[str]:
    """The user messages after the run's input: the messages sent into the run, in order."""
    return [m.content for m in messages if isinstance(m, UserMessage)][1:]


def _inbox_model(messages: Sequence[Message]) -> ModelResponse:
    """Hold once; then answer with every message sent into the run, in the order seen."""
    if not any(isinstance(m, ToolMessage) for m in messages):
        return reply(None, ("hold", {"label": "h"}))
    return reply("heard: " + " | ".join(heard(messages)))


registry.add_model("inbox", ScriptedModel(_inbox_model))
for _name, _state in (("inbox", Inbox), ("inbox_stateless", None)):
    registry.add(
        Agent(
            name=_name,
            model="scripted:inbox",
            system_prompt="signals test agent",
            tools=ToolSet([hold]),
            state_type=_state,
        )
    )


def _woken_model(messages: Sequence[Message]) -> ModelResponse:
    """Ask for a charge (it parks for approval); once woken, answer with the message and the denial."""
    results = [m for m in messages if isinstance(m, ToolMessage)]
    if not results:
        return reply(None, ("charge", {"seconds": 0, "label": "refund"}))
    said = heard(messages)
    return reply(f"woken by {said[-1] if said else '-'}; {'denied' if results[-1].is_error else 'ran'}")


registry.add_model("woken", ScriptedModel(_woken_model))


def _held_then_woken(messages: Sequence[Message]) -> ModelResponse:
    """As ``woken``, but its first answer waits until the test releases it (keys named by the run's
    input), so a message can arrive while the think that parks the run asks the model."""
    if not any(isinstance(m, ToolMessage) for m in messages):
        token = next(m.content for m in messages if isinstance(m, UserMessage))
        _redis().set(HOLDING_KEY + token, os.getpid(), ex=3600)
        deadline = time.monotonic() + 120
        while not _redis().exists(RELEASE_KEY + token) and time.monotonic() < deadline:
            time.sleep(0.02)
    return _woken_model(messages)


registry.add_model("held_then_woken", ScriptedModel(_held_then_woken))
registry.add(
    Agent(
        name="wakes_after_held_think",
        model="scripted:held_then_woken",
        system_prompt="wake test agent",
        tools=TOOLS,
        approval_required=frozenset({"charge"}),
        wake_on_message=True,
    )
)
for _name, _wakes in (("wakes_on_message", True), ("waits_for_decision", False)):
    registry.add(
        Agent(
            name=_name,
            model="scripted:woken",
            system_prompt="wake test agent",
            tools=TOOLS,
            approval_required=frozenset({"charge"}),
            wake_on_message=_wakes,
        )
    )
