"""HTTP plumbing shared by the provider adapters.

One :class:`HttpTransport` per adapter owns a pooled ``httpx.Client`` and the policy every
provider call follows:

* every httpx failure becomes a :class:`~shared.errors.ModelTransport`; network trouble
  (refused connection, timeout, dropped connection) is ``retryable``;
* 429 and 5xx answers and network trouble are retried a bounded number of times with
  exponential backoff and full jitter; a ``Retry-After`` is honoured when it is short enough
  and otherwise the call gives up at once (still retryable) instead of parking a worker thread;
* other 4xx answers are never retried: the same request would fail the same way;
* bodies are bounded, so a misbehaving endpoint cannot exhaust a worker's memory;
* a stream is only retried before its first body byte was handed on: after that the caller has
  seen part of an answer and only it can decide what to do;
* the API key never reaches an error message: it is sent by an :class:`httpx.Auth` that hides
  it, and every text copied into an error is scrubbed of it.

The SSE and NDJSON parsers buffer across arbitrary chunk boundaries: networks and proxies split
events, JSON objects and multi-byte characters anywhere.
"""

from __future__ import annotations

import email.utils
import json
import random
import re
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC
from types import TracebackType
from typing import Any, TypeVar

import httpx

from shared.errors import ConfigError, ModelTransport, excerpt
from shared.llm.base import RawToolCall

T = TypeVar("T")

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
#: Error bodies are only read for their message; a few KiB say everything useful.
ERROR_BODY_LIMIT = 64 * 1024
#: Statuses worth trying again: the provider is busy or had a transient fault.
RETRYABLE_STATUSES = frozenset({408, 429})


@dataclass(frozen=True)
class HttpSettings:
    """Timeouts, retry and size bounds of one adapter's HTTP calls.

    The read timeout is not here: it is each request's ``ModelRequest.timeout_s``.
    """

    connect_timeout_s: float = 10.0
    #: Attempts in all, the first included; 1 disables retries.
    max_attempts: int = 3
    #: Full-jitter backoff: attempt n sleeps uniformly in [0, min(max, base * 2**(n-1))].
    backoff_base_s: float = 0.5
    backoff_max_s: float = 8.0
    #: The longest ``Retry-After`` waited for in process; a longer one fails the call at once.
    retry_after_cap_s: float = 30.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be at least 1, got {self.max_attempts}")
        numbers = {
            "connect_timeout_s": self.connect_timeout_s,
            "backoff_base_s": self.backoff_base_s,
            "backoff_max_s": self.backoff_max_s,
            "retry_after_cap_s": self.retry_after_cap_s,
        }
        for name, value in numbers.items():
            if value < 0:
                raise ConfigError(f"{name} must not be negative, got {value}")
        if self.connect_timeout_s == 0 or self.max_body_bytes <= 0:
            raise ConfigError("connect_timeout_s and max_body_bytes must be positive")


class SecretHeaderAuth(httpx.Auth):
    """Adds credential headers at send time, so they live in no headers dict of ours and no
    repr shows them."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._headers = dict(headers)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers.update(self._headers)
        yield request

    def __repr__(self) -> str:
        return f"SecretHeaderAuth(headers={sorted(self._headers)!r}, values=<redacted>)"


def make_client(settings: HttpSettings, *, auth: httpx.Auth | None = None) -> httpx.Client:
    """A pooled client; each request sets its own read timeout from ``ModelRequest.timeout_s``."""
    return httpx.Client(
        auth=auth,
        timeout=httpx.Timeout(120.0, connect=settings.connect_timeout_s),
        follow_redirects=False,
        headers={"accept-encoding": "gzip, deflate"},
    )


class Redactor:
    """Scrubs secrets out of text copied into errors (a server may echo a key back)."""

    #: Shorter "secrets" would garble ordinary words and protect nothing.
    MIN_SECRET_LEN = 4

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets = sorted({s for s in secrets if len(s) >= self.MIN_SECRET_LEN}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "[redacted]")
        return text

    def __repr__(self) -> str:
        return f"Redactor({len(self._secrets)} secrets)"


# --- Retry-After and backoff ------------------------------------------------------------------


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the server asked us to wait, or None if it did not say (or said nonsense).

    ``retry-after-ms`` (sent by OpenAI) is more precise and wins; ``Retry-After`` is either
    delay-seconds or an HTTP date.
    """
    millis = _finite_non_negative(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000.0
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _finite_non_negative(raw)
    if seconds is not None:
        return seconds
    return _seconds_until_http_date(raw.strip(), time.time() if now is None else now)


def _finite_non_negative(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if 0 <= value < float("inf") else None  # also rejects NaN


def _seconds_until_http_date(raw: str, now: float) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # HTTP dates are GMT by definition
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


def backoff_delay(attempt: int, settings: HttpSettings, rng: Callable[[], float] = random.random) -> float:
    """Full jitter: spreads out clients that all failed at the same moment."""
    ceiling = min(settings.backoff_max_s, settings.backoff_base_s * 2.0 ** (attempt - 1))
    return rng() * ceiling


# --- Stream framing ---------------------------------------------------------------------------


class StreamDecodeError(ValueError):
    """A stream's framing or payload is broken. ``truncated`` says it merely ended mid-item."""

    def __init__(self, message: str, *, truncated: bool = False) -> None:
        super().__init__(message)
        self.truncated = truncated


class LineSplitter:
    """Splits bytes into lines ending in CRLF, LF or CR, across chunk boundaries.

    Lines are split as bytes and decoded whole, so a multi-byte character cut between chunks is
    reassembled before decoding.
    """

    _EOL = re.compile(rb"\r\n|\r|\n")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf known to hold no line ending; avoids rescanning

    def feed(self, data: bytes) -> list[str]:
        self._buf += data
        lines: list[str] = []
        start = 0
        for match in self._EOL.finditer(self._buf, self._scanned):
            if match.group() == b"\r" and match.end() == len(self._buf):
                break  # maybe the first half of a CRLF: wait for the next byte
            lines.append(_decode(bytes(self._buf[start : match.start()])))
            start = match.end()
        del self._buf[:start]
        self._scanned = max(0, len(self._buf) - 1) if self._buf.endswith(b"\r") else len(self._buf)
        return lines

    def finish(self) -> tuple[list[str], str | None]:
        """Complete lines still held (a final lone CR) and the unterminated rest, if any."""
        lines = self.feed(b"")
        if self._buf.endswith(b"\r"):
            lines.append(_decode(bytes(self._buf[:-1])))
            self._buf.clear()
        rest = _decode(bytes(self._buf)) if self._buf else None
        self._buf.clear()
        return lines, rest


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StreamDecodeError(f"stream is not valid UTF-8: {exc.reason}") from None


@dataclass(frozen=True)
class SseEvent:
    event: str = "message"
    data: str = ""
    id: str | None = None


@dataclass
class SseParser:
    """Server-sent events as the WHATWG spec frames them: fields per line, blank line dispatches,
    ``:`` comments ignored, multi-line ``data`` joined with newlines."""

    _lines: LineSplitter = field(default_factory=LineSplitter)
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id: str | None = None
    _started: bool = False

    def feed(self, chunk: bytes) -> list[SseEvent]:
        return [event for line in self._lines.feed(chunk) if (event := self._line(line)) is not None]

    def finish(self) -> list[SseEvent]:
        """Events completed by the last bytes. An event without its closing blank line is
        dropped, as the spec says: it may be cut short."""
        lines, _partial = self._lines.finish()
        return [event for line in lines if (event := self._line(line)) is not None]

    def _line(self, line: str) -> SseEvent | None:
        if not self._started:
            self._started = True
            line = line.removeprefix("\ufeff")
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        return None

    def _dispatch(self) -> SseEvent | None:
        event = SseEvent(event=self._event or "message", data="\n".join(self._data), id=self._id)
        has_data = bool(self._data)
        self._event, self._data = "", []
        return event if has_data else None


@dataclass
class NdjsonParser:
    """Newline-delimited JSON: one value per line, blank lines ignored."""

    _lines: LineSplitter = field(default_factory=LineSplitter)

    def feed(self, chunk: bytes) -> list[Any]:
        return [_json_line(line) for line in self._lines.feed(chunk) if line.strip()]

    def finish(self) -> list[Any]:
        lines, rest = self._lines.finish()
        values = [_json_line(line) for line in lines if line.strip()]
        if rest is not None and rest.strip():
            try:
                values.append(json.loads(rest))
            except json.JSONDecodeError:
                raise StreamDecodeError(
                    f"stream ended inside a JSON line: {excerpt(rest, 200)}", truncated=True
                ) from None
        return values


def _json_line(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise StreamDecodeError(f"malformed JSON line ({exc.msg}): {excerpt(line, 200)}") from None


# --- Errors -----------------------------------------------------------------------------------


def error_detail(body: str) -> str:
    """The human message in a provider's error body (OpenAI, Anthropic and Ollama shapes)."""
    try:
        payload = json.loads(body)
    except ValueError:
        return excerpt(body.strip(), 500) or ""
    if isinstance(payload, dict):
        error = payload.get("error", payload)
        if isinstance(error, str):
            return excerpt(error, 500) or ""
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            kind = error.get("type")
            prefix = f"{kind}: " if isinstance(kind, str) and kind else ""
            return prefix + (excerpt(error["message"], 500) or "")
    return excerpt(body.strip(), 500) or ""


class _RetryableStatus(Exception):
    """Internal: a retryable HTTP status and how long the server asked us to wait."""

    def __init__(self, error: ModelTransport, retry_after_s: float | None) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_after_s = retry_after_s


def _network_error(exc: Exception) -> tuple[str, bool]:
    """What went wrong, and whether trying again could help."""
    if isinstance(exc, httpx.ConnectTimeout):
        return "connect timeout", True
    if isinstance(exc, httpx.ReadTimeout):
        return "read timeout (no data within the request's timeout)", True
    if isinstance(exc, httpx.TimeoutException):
        return "timeout", True
    if isinstance(exc, httpx.ConnectError):
        return "connection failed", True
    if isinstance(exc, httpx.RemoteProtocolError):
        return "connection broken by the server", True
    if isinstance(exc, httpx.NetworkError):
        return "network error", True
    if isinstance(exc, httpx.DecodingError):
        return "undecodable response body", False
    return "HTTP client error", False


def raw_output(text: str | None, calls: Sequence[RawToolCall]) -> str | None:
    """The model's output as one bounded text for ``ModelResponse.raw``: what an operator needs
    to see when the runtime rejects the model's action."""
    if not calls:
        return excerpt(text)
    rendered = {"text": text, "tool_calls": [call.model_dump() for call in calls]}
    return excerpt(json.dumps(rendered, ensure_ascii=False))


# --- The transport ----------------------------------------------------------------------------


class HttpTransport:
    """One provider's connection pool, retry policy and error translation. Thread-safe."""

    def __init__(
        self,
        provider: str,
        settings: HttpSettings,
        *,
        auth: httpx.Auth | None = None,
        secrets: Sequence[str] = (),
        sleep: Callable[[float], None] = time.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.provider = provider
        self.settings = settings
        self.redact = Redactor(secrets)
        self._client = make_client(settings, auth=auth)
        self._sleep = sleep
        self._rng = rng

    def __repr__(self) -> str:
        return f"HttpTransport(provider={self.provider!r})"

    def close(self) -> None:
        self._client.close()

    def error(
        self,
        message: str,
        *,
        retryable: bool = False,
        status_code: int | None = None,
        body: str | None = None,
    ) -> ModelTransport:
        """A ModelTransport naming the provider, with every secret scrubbed out."""
        return ModelTransport(
            self.redact(f"{self.provider}: {message}"),
            status_code=status_code,
            retryable=retryable,
            body=None if body is None else self.redact(body),
        )

    @contextmanager
    def translate(self, url: httpx.URL | str) -> Iterator[None]:
        """Maps every httpx exception raised inside to a ModelTransport.

        The original exception is deliberately not chained: it holds the request, headers and
        all, and tracebacks must not print credentials.
        """
        try:
            yield
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            what, retryable = _network_error(exc)
            detail = str(exc) or type(exc).__name__
            raise self.error(
                f"{what} on POST {_safe_url(url)}: {type(exc).__name__}: {detail}", retryable=retryable
            ) from None

    # -- requests --

    def post_json(self, url: str, body: Mapping[str, Any], *, timeout_s: float) -> Any:
        """POST a JSON body and return the decoded JSON answer, retrying as the policy says."""

        def attempt() -> bytes:
            response = self._open(url, body, timeout_s)
            try:
                return self._read_bounded(response, url)
            finally:
                response.close()

        data = self._with_retries(attempt)
        return self.decode_json(data, "response body")

    @contextmanager
    def post_stream(
        self, url: str, body: Mapping[str, Any], *, timeout_s: float
    ) -> Iterator[Iterator[bytes]]:
        """POST and yield the answer's body chunks. Retries happen only until the first body
        byte arrived; the response is closed when the block exits."""

        def attempt() -> tuple[httpx.Response, Iterator[bytes], bytes]:
            response = self._open(url, body, timeout_s)
            try:
                chunks = response.iter_bytes()
                with self.translate(url):
                    first = next(chunks, b"")
            except BaseException:
                response.close()
                raise
            return response, chunks, first

        response, chunks, first = self._with_retries(attempt)
        try:
            yield self._bounded_chunks(first, chunks, url)
        finally:
            response.close()

    @contextmanager
    def stream_sse(
        self, url: str, body: Mapping[str, Any], *, timeout_s: float
    ) -> Iterator[Iterator[SseEvent]]:
        with self.post_stream(url, body, timeout_s=timeout_s) as chunks:
            yield self._framed(chunks, SseParser())

    @contextmanager
    def stream_ndjson(
        self, url: str, body: Mapping[str, Any], *, timeout_s: float
    ) -> Iterator[Iterator[Any]]:
        with self.post_stream(url, body, timeout_s=timeout_s) as chunks:
            yield self._framed(chunks, NdjsonParser())

    def decode_json(self, data: bytes | str, what: str) -> Any:
        try:
            text = data.decode("utf-8") if isinstance(data, bytes) else data
            return json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            shown = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
            raise self.error(f"malformed {what}: {exc}", body=shown) from None

    # -- internals --

    def _open(self, url: str, body: Mapping[str, Any], timeout_s: float) -> httpx.Response:
        """Sends one request and returns the streaming response if its status is 2xx."""
        timeout = httpx.Timeout(timeout_s, connect=min(self.settings.connect_timeout_s, timeout_s))
        with self.translate(url):
            request = self._client.build_request("POST", url, json=body, timeout=timeout)
            response = self._client.send(request, stream=True)
        if response.is_success:
            return response
        try:
            raise self._status_failure(response, url)
        finally:
            response.close()

    def _status_failure(self, response: httpx.Response, url: str) -> Exception:
        status = response.status_code
        body = self._read_error_body(response, url)
        detail = error_detail(body) if body else response.reason_phrase
        message = f"HTTP {status} from POST {_safe_url(url)}: {detail}"
        retryable = status in RETRYABLE_STATUSES or status >= 500
        error = self.error(message, status_code=status, retryable=retryable, body=body)
        if not retryable:
            return error
        return _RetryableStatus(error, parse_retry_after(response.headers))

    def _read_error_body(self, response: httpx.Response, url: str) -> str:
        data = bytearray()
        try:
            with self.translate(url):
                for chunk in response.iter_bytes():
                    data += chunk
                    if len(data) >= ERROR_BODY_LIMIT:
                        break
        except ModelTransport:
            pass  # the status already says what failed; a broken error body adds nothing
        return bytes(data[:ERROR_BODY_LIMIT]).decode("utf-8", "replace")

    def _read_bounded(self, response: httpx.Response, url: str) -> bytes:
        limit = self.settings.max_body_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise self._too_large(url)
        data = bytearray()
        with self.translate(url):
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) > limit:
                    raise self._too_large(url)
        return bytes(data)

    def _bounded_chunks(self, first: bytes, rest: Iterator[bytes], url: str) -> Iterator[bytes]:
        total = len(first)
        if total > self.settings.max_body_bytes:
            raise self._too_large(url)
        if first:
            yield first
        with self.translate(url):
            for chunk in rest:
                total += len(chunk)
                if total > self.settings.max_body_bytes:
                    raise self._too_large(url)
                yield chunk

    def _too_large(self, url: str) -> ModelTransport:
        return self.error(f"response from POST {_safe_url(url)} exceeds {self.settings.max_body_bytes} bytes")

    def _framed(self, chunks: Iterator[bytes], parser: SseParser | NdjsonParser) -> Iterator[Any]:
        try:
            for chunk in chunks:
                yield from parser.feed(chunk)
            yield from parser.finish()
        except StreamDecodeError as exc:
            raise self.error(f"malformed stream: {exc}", retryable=exc.truncated) from None

    def _with_retries(self, attempt: Callable[[], T]) -> T:
        settings = self.settings
        for number in range(1, settings.max_attempts + 1):
            try:
                return attempt()
            except _RetryableStatus as failure:
                error, wait = failure.error, failure.retry_after_s
            except ModelTransport as exc:
                if not exc.retryable:
                    raise
                error, wait = exc, None
            if number == settings.max_attempts:
                break
            if wait is not None and wait > settings.retry_after_cap_s:
                # Waiting longer would park a worker thread; the caller's retry policy (which
                # sees retryable=True) is the right place to come back much later.
                raise self._restated(
                    error,
                    f"{self._unprefixed(error)} (server asked to retry after {wait:.0f}s, more than "
                    f"the {settings.retry_after_cap_s:.0f}s this client waits)",
                )
            self._sleep(wait if wait is not None else backoff_delay(number, settings, self._rng))
        if settings.max_attempts == 1:
            raise error
        raise self._restated(
            error, f"gave up after {settings.max_attempts} attempts: {self._unprefixed(error)}"
        )

    def _unprefixed(self, error: ModelTransport) -> str:
        return error.message.removeprefix(f"{self.provider}: ")

    def _restated(self, error: ModelTransport, message: str) -> ModelTransport:
        body = error.details.get("body")
        return self.error(
            message,
            status_code=error.status_code,
            retryable=True,
            body=body if isinstance(body, str) else None,
        )

    def __enter__(self) -> HttpTransport:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _safe_url(url: httpx.URL | str) -> str:
    """The URL without user info or query, which may carry credentials."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return "<invalid url>"
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}{parsed.path}"
