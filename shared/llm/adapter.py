"""What every HTTP provider adapter shares: its model, settings, transport and lifecycle."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import ClassVar, Self

import httpx

from shared.errors import ConfigError, excerpt
from shared.llm.base import ModelRequest, ModelResponse, RawToolCall, StreamPart
from shared.llm.settings import HttpSettings
from shared.llm.transport import HttpTransport

__all__ = ["HttpAdapter", "raw_output"]


class HttpAdapter(ABC):
    """A provider adapter over HTTP, bound to one model.

    ``settings`` bound its calls (:class:`~shared.llm.settings.HttpSettings`; the defaults if
    None); ``transport`` replaces the network, e.g. with ``httpx.MockTransport`` in tests.
    ``ModelRequest.model`` names the run's model string and is not sent.
    """

    #: The provider's name in model strings and error messages.
    provider: ClassVar[str]
    #: Whether the provider takes a final answer's JSON schema (``ModelRequest.output``) natively;
    #: without it the think phase puts the schema in the prompt.
    native_output: ClassVar[bool] = False
    #: Set by each subclass's ``__init__`` with :meth:`_connect`.
    _http: HttpTransport

    def __init__(
        self,
        model: str,
        *,
        settings: HttpSettings | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not model:
            raise ConfigError(f"{self.provider}: empty model name")
        self.model = model
        self.settings = settings or HttpSettings()
        self._transport = transport

    def _connect(self, *, auth: httpx.Auth | None = None, secrets: Sequence[str] = ()) -> HttpTransport:
        """The adapter's transport; subclasses call it last in ``__init__``, once every check
        passed, so a rejected adapter leaves no connection pool behind."""
        return HttpTransport(
            self.provider, self.settings, auth=auth, secrets=secrets, transport=self._transport
        )

    @abstractmethod
    def complete(self, request: ModelRequest) -> ModelResponse: ...

    @abstractmethod
    def stream(self, request: ModelRequest) -> Iterator[StreamPart]: ...

    def close(self) -> None:
        """Closes the connection pool now."""
        self._http.close()

    def retire(self) -> None:
        """Closes the connection pool once no call uses it; see :meth:`HttpTransport.retire`."""
        self._http.retire()

    @property
    def closed(self) -> bool:
        return self._http.closed

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def raw_output(text: str | None, calls: Sequence[RawToolCall]) -> str | None:
    """The model's output as one bounded text for ``ModelResponse.raw``: what an operator needs
    to see when the runtime rejects the model's action."""
    if not calls:
        return excerpt(text)
    rendered = {"text": text, "tool_calls": [call.model_dump() for call in calls]}
    return excerpt(json.dumps(rendered, ensure_ascii=False))
