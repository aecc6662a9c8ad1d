"""Conversation messages: what the model sees, persisted append-only per run.

A tool call's ``arguments`` here are always a validated JSON object; raw, untrusted model
output lives in :class:`shared.llm.base.RawToolCall` until the runtime has validated it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

__all__ = [
    "AssistantMessage",
    "MESSAGE_ADAPTER",
    "Message",
    "SystemMessage",
    "ToolCall",
    "ToolMessage",
    "UserMessage",
    "dump_message",
    "load_message",
]


class ToolCall(BaseModel):
    """A tool call the runtime accepted: known tool, arguments that passed validation."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: dict[str, Any]


class SystemMessage(BaseModel):
    """The agent's instructions, first in every conversation."""

    role: Literal["system"] = "system"
    content: str


class UserMessage(BaseModel):
    """The user's input (or a correction the runtime adds after a malformed reply)."""

    role: Literal["user"] = "user"
    content: str


class AssistantMessage(BaseModel):
    """What the model answered: text and accepted tool calls."""

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ToolMessage(BaseModel):
    """A tool call's result as the model sees it."""

    role: Literal["tool"] = "tool"
    tool_call_id: str
    name: str
    content: str
    is_error: bool = False


Message = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]
MESSAGE_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)


def dump_message(message: Message) -> str:
    return message.model_dump_json(exclude_defaults=False)


def load_message(raw: str | bytes) -> Message:
    return MESSAGE_ADAPTER.validate_json(raw)
