"""A TCP forwarder on a free loopback port that can freeze, as a stalled NAT, proxy or network path
does: every connection stays open (no reset, no close reaches either end) and new ones are still
accepted, but not a byte passes either way until it thaws. It can also lose one reply: the
connection that sent a request holding given bytes is closed when the answer comes back, the
answer not passed on (the server acted on the request; its client never learns how). And it can
cut a connection at a chosen point of its answer: the client gets the answer's bytes up to there
(the head only, half an event of a stream), then the connection closes, as a network path that
fails mid-answer does.
"""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["TcpProxy"]


class TcpProxy:
    """Forwards every connection to ``upstream`` (host, port) through two threads."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._markers: tuple[bytes, ...] = ()
        self._dropped = threading.Event()
        self._cut: _Cut | None = None
        threading.Thread(target=self._accept, name="tcp-proxy-accept", daemon=True).start()

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def drop_reply_to(self, *markers: bytes) -> threading.Event:
        """Lose the reply to the next request holding every one of ``markers``: the request is
        passed on, and its connection closed once the reply arrives, before any of it is passed
        back. The event is set once that happened (a single request at a time on the connection,
        as a Redis client sends a command and reads its reply)."""
        with self._lock:
            self._markers = markers
            self._dropped = threading.Event()
            return self._dropped

    def cut_answer(self, after: bytes, then: bytes = b"") -> threading.Event:
        """Cut the next connection whose answer holds ``after``: the client gets the answer up to
        the end of ``after`` (with ``then``: up to the end of the first ``then`` that follows it),
        and the connection closes, both ways. ``after=b""`` cuts before any byte of the answer.
        The event is set once the cut happened."""
        with self._lock:
            self._cut = _Cut(after, then)
            return self._cut.done

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                continue  # closed
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                downstream.close()  # the upstream refused: the client sees its connection drop
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [downstream, upstream]
            link = _Link()
            for src, dst, request in ((downstream, upstream, True), (upstream, downstream, False)):
                threading.Thread(target=self._pump, args=(src, dst, link, request), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, link: _Link, request: bool) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            self._flowing.wait()  # frozen: hold what came in, and an end of stream too
            if not data or self._closed:
                break
            with self._lock:
                if request:
                    link.sent = (link.sent + data)[-(1 << 20) :]
                    if self._markers and all(m in link.sent for m in self._markers):
                        self._markers, link.losing = (), True
                elif link.losing:
                    self._dropped.set()
                    break  # the reply is lost with the connection
                else:
                    link.sent = b""  # answered: what comes next is another request
                    cut = self._cut
                    if cut is not None and (passed := cut.passed(link, data)) is not None:
                        data, link.cut, self._cut = data[:passed], True, None
                        cut.done.set()
            try:
                dst.sendall(data)
            except OSError:
                break
            if link.cut:
                break
        for s in (src, dst):  # the connection ends for both ends (the other pump sees it too)
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


class _Link:
    """One forwarded connection: the bytes of its request not answered yet, and whether the
    reply to them is to be lost."""

    def __init__(self) -> None:
        self.sent = b""
        self.losing = False
        #: Whether the answer was cut (:meth:`TcpProxy.cut_answer`): the connection ends.
        self.cut = False


class _Cut:
    """Where to cut the next answer that reaches it (:meth:`TcpProxy.cut_answer`)."""

    def __init__(self, after: bytes, then: bytes) -> None:
        self.after, self.then = after, then
        self.done = threading.Event()
        #: What each connection passed back since the cut was asked for (not earlier answers of a
        #: connection kept alive): a marker may arrive split between two reads.
        self.seen: dict[_Link, bytes] = {}

    def passed(self, link: _Link, data: bytes) -> int | None:
        """How many bytes of ``data`` (coming next on ``link``) pass before the cut; None: the
        cut is not in them."""
        before = self.seen.get(link, b"")
        seen = self.seen[link] = before + data
        at = seen.find(self.after)
        if at < 0:
            return None
        end = at + len(self.after)
        if self.then:
            then_at = seen.find(self.then, end)
            if then_at < 0:
                return None
            end = then_at + len(self.then)
        return end - len(before)
