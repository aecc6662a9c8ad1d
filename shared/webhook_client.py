"""The HTTP client that posts webhooks: it connects only to addresses it has checked.

Checking a URL's host and then letting the HTTP client resolve it again is open to DNS rebinding:
a name that answers a public address to the check and a loopback or metadata address to the
connection passes. Here the network backend under httpx's connection pool does both for each new
connection: it resolves the host once (:func:`shared.webhooks.resolve_checked`, which refuses a
non-public address unless the deployment allows them) and connects to exactly those addresses.
Everything above the socket still uses the URL's host name: the ``Host`` header, TLS's SNI and
the certificate's name check (httpcore passes the origin's host to ``start_tls``), and the pool's
key, so a pooled connection is reused only for the host it was checked and verified for.

Proxies from the environment are ignored (``trust_env=False``): a proxy would resolve and connect
on its own, past the check.

Imported on a webhook's first delivery only: httpx costs a worker that never posts one memory in
every process.
"""

from __future__ import annotations

import ssl
import threading
import time
import typing

import httpcore
import httpx

from shared.webhooks import resolve_checked

__all__ = ["CheckedBackend", "CheckedTransport", "webhook_client"]


#: The monotonic time the request under way on this thread must be answered by (None: none).
_due = threading.local()


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write is cut off at the deadline of the request it serves.

    httpx's timeout bounds each read, not the exchange: a receiver that sends its answer a byte at
    a time, each within the timeout, held a worker's slot for as long as it liked."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def _left(self, timeout: float | None, error: type[Exception]) -> float | None:
        due: float | None = getattr(_due, "at", None)
        if due is None:
            return timeout
        left = due - time.monotonic()
        if left <= 0:
            raise error("the receiver did not answer within the delivery's deadline")
        return left if timeout is None else min(timeout, left)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        left = self._left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, left))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class CheckedBackend(httpcore.NetworkBackend):
    """Opens a TCP connection only to an address the host name resolved to and that was checked."""

    def __init__(self, *, allow_private: bool, inner: httpcore.NetworkBackend | None = None) -> None:
        self.allow_private = allow_private
        self._inner = inner if inner is not None else httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        # InvalidRequest (refused or unresolved) propagates as is: it is not a network error to
        # retry at once, and the delivery records its message.
        addresses = resolve_checked(host, port, allow_private=self.allow_private)
        failure: httpcore.ConnectError | httpcore.ConnectTimeout | None = None
        # Each checked address in the resolver's order, as socket.create_connection would try
        # them; the inner backend gets an IP literal, so nothing is resolved again.
        for address in addresses:
            try:
                stream = self._inner.connect_tcp(str(address), port, timeout, local_address, socket_options)
                return _DeadlineStream(stream)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        raise failure or httpcore.ConnectError(f"{host!r} resolved to no address")

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("webhooks are delivered over TCP only")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class CheckedTransport(httpx.HTTPTransport):
    """httpx's own transport over a connection pool whose connections are made by a
    :class:`CheckedBackend` (httpx takes no network backend of its own, so the pool it builds is
    replaced by one that has it, with the same TLS context)."""

    def __init__(
        self,
        *,
        allow_private: bool,
        ssl_context: ssl.SSLContext | None = None,
        inner: httpcore.NetworkBackend | None = None,
    ) -> None:
        context = ssl_context if ssl_context is not None else httpx.create_ssl_context()
        super().__init__(verify=context, trust_env=False)
        self.backend = CheckedBackend(allow_private=allow_private, inner=inner)
        #: How long one exchange may take, from sending the request to the answer's head.
        self.deadline_s: float | None = None
        self._pool = httpcore.ConnectionPool(
            ssl_context=context,
            max_connections=100,  # httpx's default limits
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=self.backend,
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """The exchange up to the answer's head, cut off at ``deadline_s`` (the body, which the
        delivery never reads, is not under it)."""
        _due.at = None if self.deadline_s is None else time.monotonic() + self.deadline_s
        try:
            return super().handle_request(request)
        finally:
            _due.at = None


def webhook_client(
    *,
    timeout_s: float,
    allow_private: bool,
    ssl_context: ssl.SSLContext | None = None,
    inner: httpcore.NetworkBackend | None = None,
) -> httpx.Client:
    """A client that posts only to checked addresses, follows no redirect (a redirect would lead
    to a URL nobody checked) and uses no proxy from the environment."""
    transport = CheckedTransport(allow_private=allow_private, ssl_context=ssl_context, inner=inner)
    # ``timeout_s`` bounds the whole exchange up to the answer's head too, not each read only.
    transport.deadline_s = timeout_s
    return httpx.Client(transport=transport, timeout=timeout_s, follow_redirects=False, trust_env=False)
