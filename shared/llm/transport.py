"""One provider's HTTP plumbing: a pooled ``httpx.Client``, its credentials and its bounds.

:class:`HttpTransport` sends every provider call and keeps these promises:

* every httpx failure becomes a :class:`~shared.errors.ModelTransport`, retried as
  :mod:`shared.llm.retry` says;
* bodies are bounded, so a misbehaving endpoint cannot exhaust a worker's memory;
* a stream is only retried before its first body byte was handed on: after that the caller has
  seen part of an answer and only it can decide what to do;
* bodies are decoded as :mod:`shared.llm.framing` says, and no error text holds a lone surrogate;
* the API key never reaches an error message: it is sent by an :class:`httpx.Auth` that hides
  it, and every text copied into an error is scrubbed of it.
"""

from __future__ import annotations

import functools
import json
import random
import ssl
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import httpx

from shared.errors import ModelTransport, excerpt
from shared.llm.framing import (
    NdjsonParser,
    SseEvent,
    SseParser,
    StreamDecodeError,
    Utf8Decoder,
    decode_utf8,
)
from shared.llm.retry import Retrier, RetryableStatus, is_retryable_status, network_failure, parse_retry_after
from shared.llm.settings import HttpSettings
from shared.llm.text import clean_text

__all__ = [
    "ERROR_BODY_LIMIT",
    "HttpTransport",
    "Redactor",
    "SecretHeaderAuth",
    "error_detail",
    "make_client",
    "safe_url",
    "shared_ssl_context",
]

#: Error bodies are only read for their message; a few KiB say everything useful.
ERROR_BODY_LIMIT = 64 * 1024


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


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """The TLS context of every provider client of the process, built as httpx builds its
    default one (certifi's CA bundle, or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``) on first use.

    Building one per client costs tens of milliseconds and about 0.8 MB (the parsed CA bundle):
    most of what an adapter costs. One context is safe to share between clients and threads.
    """
    return httpx.create_ssl_context()


def make_client(
    settings: HttpSettings,
    *,
    auth: httpx.Auth | None = None,
    transport: httpx.BaseTransport | None = None,
) -> httpx.Client:
    """A pooled client with the settings' timeouts (a request may set its own read timeout).

    ``transport`` replaces the network (``httpx.MockTransport`` in tests)."""
    return httpx.Client(
        auth=auth,
        transport=transport,
        verify=shared_ssl_context(),
        timeout=httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s),
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


def safe_url(url: httpx.URL | str) -> str:
    """The URL without user info or query, which may carry credentials."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return "<invalid url>"
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}{parsed.path}"


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
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.provider = provider
        self.settings = settings
        self.redact = Redactor(secrets)
        self._retrier = Retrier(settings, sleep=sleep, rng=rng)
        self._auth = auth
        self._transport = transport
        self._client = make_client(settings, auth=auth, transport=transport)
        self._lock = threading.Lock()
        self._active = 0  # calls under way
        self._retired = False

    def __repr__(self) -> str:
        return f"HttpTransport(provider={self.provider!r})"

    # -- lifecycle --

    def close(self) -> None:
        """Closes the connection pool now; calls under way fail."""
        self._client.close()

    def retire(self) -> None:
        """Closes the connection pool as soon as no call uses it (at once if none does).

        A retired transport still serves calls, each on a pool of its own that is closed when
        the call ends: whoever obtained the adapter before it was retired may still use it.
        """
        with self._lock:
            self._retired = True
            if self._active == 0:
                self._client.close()

    @property
    def closed(self) -> bool:
        """True when no connection pool is open (a retired transport between calls)."""
        with self._lock:
            return self._client.is_closed

    @contextmanager
    def _in_use(self) -> Iterator[httpx.Client]:
        with self._lock:
            if self._retired and self._client.is_closed:
                self._client = make_client(self.settings, auth=self._auth, transport=self._transport)
            self._active += 1
            client = self._client
        try:
            yield client
        finally:
            with self._lock:
                self._active -= 1
                if self._retired and self._active == 0:
                    self._client.close()

    def __enter__(self) -> HttpTransport:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- errors --

    def error(
        self,
        message: str,
        *,
        retryable: bool = False,
        status_code: int | None = None,
        body: str | None = None,
    ) -> ModelTransport:
        """A ModelTransport naming the provider, with every secret (and lone surrogate) scrubbed out."""
        return ModelTransport(
            clean_text(self.redact(f"{self.provider}: {message}")),
            status_code=status_code,
            retryable=retryable,
            body=None if body is None else clean_text(self.redact(body)),
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
            what, retryable = network_failure(exc)
            detail = str(exc) or type(exc).__name__
            raise self.error(
                f"{what} on POST {safe_url(url)}: {type(exc).__name__}: {detail}", retryable=retryable
            ) from None

    # -- requests --

    def post_json(self, url: str, body: Mapping[str, Any], *, timeout_s: float | None = None) -> Any:
        """POST a JSON body and return the decoded JSON answer, retrying as the policy says.

        ``timeout_s`` replaces the settings' read timeout for this call."""

        def attempt(client: httpx.Client) -> str:
            response = self._open(client, url, body, timeout_s)
            try:
                return self._read_bounded(response, url)
            finally:
                response.close()

        with self._in_use() as client:
            text = self._retrier.run(lambda: attempt(client), self._restated)
        return self.decode_json(text, "response body")

    @contextmanager
    def post_stream(
        self, url: str, body: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> Iterator[Iterator[bytes]]:
        """POST and yield the answer's body chunks. Retries happen only until the first body
        byte arrived; the response is closed when the block exits."""

        def attempt(client: httpx.Client) -> tuple[httpx.Response, Iterator[bytes], bytes]:
            response = self._open(client, url, body, timeout_s)
            try:
                chunks = response.iter_bytes()
                with self.translate(url):
                    first = next(chunks, b"")
            except BaseException:
                response.close()
                raise
            return response, chunks, first

        with self._in_use() as client:
            response, chunks, first = self._retrier.run(lambda: attempt(client), self._restated)
            try:
                yield self._bounded_chunks(first, chunks, url)
            finally:
                response.close()

    @contextmanager
    def stream_sse(
        self, url: str, body: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> Iterator[Iterator[SseEvent]]:
        with self.post_stream(url, body, timeout_s=timeout_s) as chunks:
            yield self._framed(chunks, SseParser())

    @contextmanager
    def stream_ndjson(
        self, url: str, body: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> Iterator[Iterator[Any]]:
        with self.post_stream(url, body, timeout_s=timeout_s) as chunks:
            yield self._framed(chunks, NdjsonParser())

    def decode_json(self, data: bytes | str, what: str) -> Any:
        text = decode_utf8(data) if isinstance(data, bytes) else data
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise self.error(f"malformed {what}: {exc}", body=text) from None

    # -- internals --

    def _open(
        self, client: httpx.Client, url: str, body: Mapping[str, Any], timeout_s: float | None
    ) -> httpx.Response:
        """Sends one request and returns the streaming response if its status is 2xx."""
        read = self.settings.read_timeout_s if timeout_s is None else timeout_s
        timeout = httpx.Timeout(read, connect=min(self.settings.connect_timeout_s, read))
        with self.translate(url):
            request = client.build_request("POST", url, json=body, timeout=timeout)
            response = client.send(request, stream=True)
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
        message = f"HTTP {status} from POST {safe_url(url)}: {detail}"
        retryable = is_retryable_status(status)
        error = self.error(message, status_code=status, retryable=retryable, body=body)
        if not retryable:
            return error
        return RetryableStatus(error, parse_retry_after(response.headers))

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
        return decode_utf8(bytes(data[:ERROR_BODY_LIMIT]))

    def _read_bounded(self, response: httpx.Response, url: str) -> str:
        limit = self.settings.max_body_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise self._too_large(url)
        decoder = Utf8Decoder()
        parts: list[str] = []
        size = 0
        with self.translate(url):
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > limit:
                    raise self._too_large(url)
                parts.append(decoder.feed(chunk))
        parts.append(decoder.finish())
        return "".join(parts)

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
        return self.error(f"response from POST {safe_url(url)} exceeds {self.settings.max_body_bytes} bytes")

    def _framed(self, chunks: Iterator[bytes], parser: SseParser | NdjsonParser) -> Iterator[Any]:
        try:
            for chunk in chunks:
                yield from parser.feed(chunk)
            yield from parser.finish()
        except StreamDecodeError as exc:
            raise self.error(f"malformed stream: {exc}", retryable=exc.truncated) from None

    def _restated(self, error: ModelTransport, rewrite: Callable[[str], str]) -> ModelTransport:
        """``error`` again (retryable), its message without the provider rewritten."""
        body = error.details.get("body")
        return self.error(
            rewrite(error.message.removeprefix(f"{self.provider}: ")),
            status_code=error.status_code,
            retryable=True,
            body=body if isinstance(body, str) else None,
        )
