"""Ollama's chat API (``ollama:MODEL``).

Wire format: ``POST {host}/api/chat``; tools in OpenAI's function format; tool call arguments
arrive as JSON *objects* and are passed on as they are; calls carry no ids, so they get
positional ones (``call_0``, ``call_1``; an id a newer server does send is kept); tool results
are ``tool`` messages naming the tool in ``tool_name``. Streams are NDJSON and end with an
object whose ``done`` is true: a stream without it was cut short and is an error, never an
answer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from shared.errors import ConfigError
from shared.llm.adapter import HttpAdapter, raw_output
from shared.llm.base import ModelRequest, ModelResponse, RawToolCall, StreamPart, TextDelta, Usage
from shared.llm.openai import wire_tools
from shared.llm.settings import HttpSettings
from shared.llm.text import SurrogateJoiner
from shared.messages import AssistantMessage, Message, SystemMessage, ToolMessage, UserMessage

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "OllamaAdapter",
    "parse_host",
    "wire_message",
    "TRUNCATED",
]

DEFAULT_HOST = "http://127.0.0.1:11434"
DEFAULT_PORT = 11434
#: The ``done_reason`` of an answer cut at ``num_predict`` (or the context's end).
TRUNCATED = "length"


def parse_host(value: str | None) -> str:
    """``OLLAMA_HOST`` read the way the ``ollama`` CLI reads it: ``host``, ``host:port`` or a
    URL; no scheme means http and port 11434, an explicit http/https scheme defaults to 80/443."""
    raw = (value or "").strip().rstrip("/")
    if not raw:
        return DEFAULT_HOST
    scheme, sep, rest = raw.partition("://")
    if not sep:
        scheme, rest, default_port = "http", raw, DEFAULT_PORT
    elif scheme in ("http", "https"):
        default_port = 80 if scheme == "http" else 443
    else:
        raise ConfigError(f"OLLAMA_HOST has an unsupported scheme {scheme!r}: {value!r}")
    hostport, slash, path = rest.partition("/")
    host, port = _split_host_port(hostport, default_port, value)
    return f"{scheme}://{host}:{port}" + (f"/{path}" if slash and path else "")


def _split_host_port(hostport: str, default_port: int, original: str | None) -> tuple[str, int]:
    if hostport.startswith("["):  # [ipv6] or [ipv6]:port
        end = hostport.find("]")
        host, tail = hostport[: end + 1], hostport[end + 1 :]
        port_text = tail.removeprefix(":") if tail.startswith(":") else ""
    elif hostport.count(":") == 1:
        host, port_text = hostport.split(":")
    elif ":" in hostport:  # a bare IPv6 address
        host, port_text = f"[{hostport}]", ""
    else:
        host, port_text = hostport, ""
    host = host or "127.0.0.1"
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"OLLAMA_HOST has an invalid port: {original!r}")
    return host, int(port_text)


def wire_message(message: Message) -> dict[str, Any]:
    if isinstance(message, SystemMessage | UserMessage):
        return {"role": message.role, "content": message.content}
    if isinstance(message, ToolMessage):
        return {"role": "tool", "content": message.content, "tool_name": message.name}
    return _wire_assistant(message)


def _wire_assistant(message: AssistantMessage) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if message.tool_calls:
        wire["tool_calls"] = [
            {"function": {"name": call.name, "arguments": call.arguments}} for call in message.tool_calls
        ]
    return wire


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Function(_Wire):
    name: str | None = None
    arguments: Any = None


class _ToolCall(_Wire):
    id: str | None = None
    function: _Function | None = None


class _Message(_Wire):
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Chunk(_Wire):
    """Both a whole answer and one stream line: the same object shape."""

    message: _Message | None = None
    done: bool = False
    done_reason: str | None = None
    prompt_eval_count: int = 0
    eval_count: int = 0
    error: str | dict[str, Any] | None = None


class _Answer:
    """Accumulates text and calls, numbering calls by position across the whole answer. Text
    pieces are joined so that a character cut between two lines arrives whole."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: list[RawToolCall] = []
        self._joiner = SurrogateJoiner()

    def add(self, message: _Message | None) -> str:
        if message is None:
            return ""
        for call in message.tool_calls or []:
            function = call.function or _Function()
            ident = call.id or f"call_{len(self.calls)}"
            self.calls.append(RawToolCall(id=ident, name=function.name or "", arguments=function.arguments))
        return self._text(self._joiner.feed(message.content or ""))

    def finish(self) -> str:
        """The text a character left incomplete by the last line becomes ("" if none)."""
        return self._text(self._joiner.finish())

    def _text(self, delta: str) -> str:
        if delta:
            self.text.append(delta)
        return delta

    def response(self, last: _Chunk) -> ModelResponse:
        text = "".join(self.text) or None
        return ModelResponse(
            text=text,
            tool_calls=self.calls,
            usage=Usage(input_tokens=last.prompt_eval_count, output_tokens=last.eval_count),
            finish_reason=last.done_reason,
            truncated=last.done_reason == TRUNCATED,
            raw=raw_output(text, self.calls),
        )


class OllamaAdapter(HttpAdapter):
    """``ollama:MODEL`` over ``/api/chat``. The adapter is bound to ``model``."""

    provider = "ollama"
    #: Takes the final answer's JSON schema natively (``format``).
    native_output: ClassVar[bool] = True

    def __init__(
        self,
        model: str,
        *,
        host: str = DEFAULT_HOST,
        settings: HttpSettings | None = None,
        keep_alive: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(model, settings=settings, transport=transport)
        self.host = parse_host(host)
        #: How long the server keeps the model loaded after a call (Ollama's own default if None).
        self.keep_alive = keep_alive
        self._url = f"{self.host}/api/chat"
        self._http = self._connect()

    @classmethod
    def from_env(
        cls,
        model: str,
        *,
        settings: HttpSettings | None = None,
        environ: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> OllamaAdapter:
        """Reads ``OLLAMA_HOST`` as the ollama CLI does; no key is needed."""
        env = os.environ if environ is None else environ
        return cls(model, host=parse_host(env.get("OLLAMA_HOST")), settings=settings, transport=transport)

    def __repr__(self) -> str:
        return f"OllamaAdapter(model={self.model!r}, host={self.host!r})"

    def body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [wire_message(m) for m in request.messages],
            "stream": stream,  # Ollama streams unless told not to
        }
        if request.tools:
            body["tools"] = wire_tools(request.tools)
        if request.output is not None:
            body["format"] = request.output.schema_  # structured outputs: the schema itself
        options: dict[str, Any] = {}
        if request.temperature is not None:
            options["temperature"] = request.temperature
        if request.max_tokens is not None:
            options["num_predict"] = request.max_tokens
        if options:
            body["options"] = options
        if self.keep_alive is not None:
            body["keep_alive"] = self.keep_alive
        return body

    def complete(self, request: ModelRequest) -> ModelResponse:
        payload = self._http.post_json(
            self._url, self.body(request, stream=False), timeout_s=request.timeout_s
        )
        chunk = self._parse(payload, "response body")
        if chunk.message is None:
            raise self._http.error("response has no message", body=json.dumps(payload))
        answer = _Answer()
        answer.add(chunk.message)
        answer.finish()
        return answer.response(chunk)

    def stream(self, request: ModelRequest) -> Iterator[StreamPart]:
        answer = _Answer()
        with self._http.stream_ndjson(
            self._url, self.body(request, stream=True), timeout_s=request.timeout_s
        ) as lines:
            for line in lines:
                chunk = self._parse(line, "stream line")
                delta = answer.add(chunk.message)
                if chunk.done:
                    delta += answer.finish()
                if delta:
                    yield TextDelta(text=delta)
                if chunk.done:
                    break
            else:
                raise self._http.error(
                    "stream ended without done: true; the answer is incomplete", retryable=True
                )
        yield answer.response(chunk)

    def _parse(self, payload: Any, what: str) -> _Chunk:
        try:
            chunk = _Chunk.model_validate(payload)
        except ValidationError as exc:
            raise self._http.error(
                f"malformed {what}: {exc.error_count()} validation errors", body=json.dumps(payload)
            ) from None
        if chunk.error is not None:
            raise self._http.error(f"provider reported an error: {json.dumps(chunk.error)}")
        return chunk
