"""Tool use for models without native tool calling, by the ReAct text protocol.

The tools and the Thought / Action / Action Input / Observation / Final Answer format go into the
system prompt; past calls and results are replayed as that text; the model's reply is parsed
back into a :class:`ModelResponse`. The wrapped adapter never sees native tools.

Parsing is deliberately lenient about layout and strict about meaning: an ``Action:`` whose
input is missing or not JSON still becomes a tool call carrying the raw text, so the runtime
rejects it as an ``InvalidModelAction`` the model can be told about, instead of the adapter
silently treating a botched action as an answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

from shared.errors import excerpt
from shared.llm.base import (
    LlmAdapter,
    ModelRequest,
    ModelResponse,
    RawToolCall,
    StreamPart,
    TextDelta,
    ToolSpec,
)
from shared.messages import AssistantMessage, Message, SystemMessage, ToolMessage, UserMessage

__all__ = [
    "FINAL_ANSWER",
    "FORMAT_INSTRUCTIONS",
    "ParsedReply",
    "ReActAdapter",
    "parse_reply",
    "render_messages",
    "render_tools",
    "system_prompt",
    "to_response",
]

FINAL_ANSWER = "Final Answer:"
_ACTION = re.compile(r"^[ \t]*Action[ \t]*:[ \t]*(?P<name>.*)$", re.MULTILINE)
_ACTION_INPUT = re.compile(r"^[ \t]*Action[ \t]*Input[ \t]*:", re.MULTILINE)
_FINAL = re.compile(r"^[ \t]*Final[ \t]*Answer[ \t]*:", re.MULTILINE)
#: A model sometimes goes on to invent the tool's result; nothing from there on is its action.
_OBSERVATION = re.compile(r"^[ \t]*Observation[ \t]*:", re.MULTILINE)
_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(?P<body>.*?)\n?```\s*$", re.DOTALL)

FORMAT_INSTRUCTIONS = """\
Answer the user's request. You can use these tools:

{tools}

Use exactly this format:

Thought: think about what to do next
Action: the tool to use, one of [{names}]
Action Input: the tool's input as one JSON object
Observation: the tool's result (it is given to you; never write it yourself)
... (Thought / Action / Action Input / Observation may repeat)
Thought: I now know the final answer
Final Answer: the answer to the user

Write one Action at a time and stop after its Action Input to wait for the Observation.\
"""


def render_tools(tools: list[ToolSpec]) -> str:
    if not tools:
        return "(no tools: answer directly with a Final Answer)"
    return "\n".join(
        f"- {t.name}: {t.description}\n  Input JSON schema: {json.dumps(t.parameters, sort_keys=True)}"
        for t in tools
    )


def system_prompt(tools: list[ToolSpec], base: str | None = None) -> str:
    instructions = FORMAT_INSTRUCTIONS.format(
        tools=render_tools(tools), names=", ".join(t.name for t in tools)
    )
    return f"{base}\n\n{instructions}" if base else instructions


def render_messages(messages: list[Message], tools: list[ToolSpec]) -> list[Message]:
    """The conversation as plain text turns, with the ReAct instructions in the system prompt."""
    rendered: list[Message] = []
    instructed = False
    for message in messages:
        if isinstance(message, SystemMessage) and not instructed:
            rendered.append(SystemMessage(content=system_prompt(tools, message.content)))
            instructed = True
        elif isinstance(message, AssistantMessage):
            rendered.append(AssistantMessage(content=_render_assistant(message)))
        elif isinstance(message, ToolMessage):
            observation = _render_observation(message)
            previous = rendered[-1] if rendered else None
            if isinstance(previous, UserMessage) and previous.content.startswith("Observation"):
                rendered[-1] = UserMessage(content=f"{previous.content}\n{observation}")
            else:
                rendered.append(UserMessage(content=observation))
        else:
            rendered.append(message)
    if not instructed:
        rendered.insert(0, SystemMessage(content=system_prompt(tools)))
    return rendered


def _render_assistant(message: AssistantMessage) -> str:
    content = (message.content or "").strip()
    if not message.tool_calls:
        return content if _FINAL.search(content) else f"{FINAL_ANSWER} {content}"
    lines = [content] if content else []
    for call in message.tool_calls:
        lines.append(f"Action: {call.name}\nAction Input: {json.dumps(call.arguments, ensure_ascii=False)}")
    return "\n".join(lines)


def _render_observation(message: ToolMessage) -> str:
    label = "Observation (error)" if message.is_error else "Observation"
    return f"{label}: {message.content}"


# --- Parsing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedReply:
    """What a ReAct reply asks for: an action (name and raw input) or a final answer."""

    thought: str | None
    action: str | None = None
    action_input: str | None = None
    answer: str | None = None


def parse_reply(text: str) -> ParsedReply:
    """Parses one reply. The first of ``Action:`` and ``Final Answer:`` decides; text with
    neither is the final answer as it stands."""
    cut = _OBSERVATION.search(text)
    body = text[: cut.start()] if cut else text
    action, final = _ACTION.search(body), _FINAL.search(body)
    if action is not None and (final is None or action.start() < final.start()):
        thought = _thought(body[: action.start()])
        rest = body[action.end() :]
        found = _ACTION_INPUT.search(rest)
        raw_input = _json_prefix(rest[found.end() :]) if found else ""
        return ParsedReply(thought=thought, action=_clean_name(action.group("name")), action_input=raw_input)
    if final is not None:
        return ParsedReply(thought=_thought(body[: final.start()]), answer=body[final.end() :].strip())
    return ParsedReply(thought=None, answer=text.strip())


def _thought(text: str) -> str | None:
    text = text.strip()
    text = re.sub(r"^Thought[ \t]*:[ \t]*", "", text)
    return text or None


def _clean_name(name: str) -> str:
    """Models decorate names: ``get_weather``, [get_weather], "get_weather"."""
    return name.strip().strip("`'\"[]*").strip()


def _json_prefix(text: str) -> str:
    """The input's JSON value if it starts with one (the rest is chatter), else the raw text.

    Either way it stays text: the runtime, not this parser, decides whether it is valid.
    """
    text = text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group("body").strip()
    try:
        _, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        return text
    return text[:end]


def to_response(text: str, base: ModelResponse, call_number: int) -> ModelResponse:
    """The parsed reply as the runtime's response, keeping the inner usage and finish reason."""
    parsed = parse_reply(text)
    if parsed.action is None:
        return base.model_copy(update={"text": parsed.answer or None, "tool_calls": [], "raw": excerpt(text)})
    call = RawToolCall(id=f"react_{call_number}", name=parsed.action, arguments=parsed.action_input)
    return base.model_copy(update={"text": parsed.thought, "tool_calls": [call], "raw": excerpt(text)})


# --- The adapter ------------------------------------------------------------------------------


class _FinalAnswerFilter:
    """Passes on only the text after ``Final Answer:`` (the marker may be split across deltas),
    and nothing at all once an ``Action:`` shows the reply is a tool call."""

    def __init__(self) -> None:
        self.buffer = ""
        self.next = -1  # index in buffer of the first char not yet passed on; -1: no answer yet
        self.is_action = False
        self.skipping_space = False

    def feed(self, delta: str) -> str:
        self.buffer += delta
        if self.is_action:
            return ""
        if self.next < 0:
            final, action = _FINAL.search(self.buffer), _ACTION.search(self.buffer)
            if action is not None and (final is None or action.start() < final.start()):
                self.is_action = True
                return ""
            if final is None:
                return ""
            self.next = final.end()
            self.skipping_space = True
        if self.skipping_space:  # the answer starts after the marker's trailing blanks
            while self.next < len(self.buffer) and self.buffer[self.next].isspace():
                self.next += 1
            self.skipping_space = self.next == len(self.buffer)
        out, self.next = self.buffer[self.next :], len(self.buffer)
        return out


class ReActAdapter:
    """Wraps an adapter whose model has no native tool calling.

    ``tools`` overrides the request's tools when given; the inner adapter gets none.
    """

    def __init__(self, inner: LlmAdapter, tools: list[ToolSpec] | None = None) -> None:
        self.inner = inner
        self.tools = tools

    def __repr__(self) -> str:
        return f"ReActAdapter({self.inner!r})"

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()

    def retire(self) -> None:
        """Retires the inner adapter (closes its connections once unused), if it can be."""
        retire = getattr(self.inner, "retire", None) or getattr(self.inner, "close", None)
        if callable(retire):
            retire()

    def inner_request(self, request: ModelRequest) -> ModelRequest:
        tools = self.tools if self.tools is not None else request.tools
        return request.model_copy(update={"messages": render_messages(request.messages, tools), "tools": []})

    def complete(self, request: ModelRequest) -> ModelResponse:
        response = self.inner.complete(self.inner_request(request))
        return to_response(response.text or "", response, _calls_so_far(request))

    def stream(self, request: ModelRequest) -> Iterator[StreamPart]:
        answer = _FinalAnswerFilter()
        forwarded_any = False
        for part in self.inner.stream(self.inner_request(request)):
            if isinstance(part, TextDelta):
                out = answer.feed(part.text)
                if out:
                    forwarded_any = True
                    yield TextDelta(text=out)
                continue
            final = to_response(part.text or "", part, _calls_so_far(request))
            if not forwarded_any and not final.tool_calls and final.text:
                # A reply without "Final Answer:" is the answer as a whole: pass it on whole.
                yield TextDelta(text=final.text)
            yield final
            return


def _calls_so_far(request: ModelRequest) -> int:
    """Numbers calls across the run, so every ``react_N`` id is unique in the conversation."""
    return sum(len(m.tool_calls) for m in request.messages if isinstance(m, AssistantMessage))
