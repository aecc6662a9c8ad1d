"""LLM adapters: one protocol, one module per wire format."""

from shared.llm.base import (
    LlmAdapter,
    ModelRequest,
    ModelResponse,
    OutputFormat,
    RawToolCall,
    StreamPart,
    TextDelta,
    ToolSpec,
    Usage,
)

__all__ = [
    "LlmAdapter",
    "ModelRequest",
    "ModelResponse",
    "OutputFormat",
    "RawToolCall",
    "StreamPart",
    "TextDelta",
    "ToolSpec",
    "Usage",
]
