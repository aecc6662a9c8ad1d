"""The HTTP clients do not trust the server with their memory: a raw-socket server sends an endless
answer, an endless event-stream line and an event that never ends, and each client stops reading at
its bound with :class:`AnswerTooLarge`; answers and events within the bounds read as ever."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from producer.api_client import AnswerTooLarge, ApiClient, AsyncClient
from shared.events import Completed
from shared.llm.base import Usage
from tests.harness import wait_until

#: What the server sends of an endless answer before it gives up: far past every bound of these
#: tests, so a client that stopped at its bound is told from one that read on.
SERVER_CAP = 32 * 1024 * 1024
LIMIT = 1024 * 1024
CHUNK = 64 * 1024

#: path -> the answer's head (status line and headers) and its body's chunks.
Answer = Callable[[str], tuple[bytes, Iterator[bytes]]]


class RawServer:
    """HTTP/1.1 on a bare socket, each connection in its own thread: reads a request's head,
    sends what ``answer`` gives for its path, counts the bytes sent until the client hung up."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.paths: list[str] = []
        self.sent: list[int] = []  # body bytes sent, per connection ended
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        sent = 0
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    return
                head += data
            path = head.split(b" ", 2)[1].decode()
            self.paths.append(path)
            status, body = self.answer(path)
            try:
                conn.sendall(status)
                for chunk in body:
                    conn.sendall(chunk)
                    sent += len(chunk)
            except OSError:
                pass  # the client hung up
        self.sent.append(sent)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Answer], RawServer]]:
    servers: list[RawServer] = []

    def start(answer: Answer) -> RawServer:
        servers.append(RawServer(answer))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _head(content_type: str, length: int | None = None) -> bytes:
    framing = f"Content-Length: {length}" if length is not None else "Connection: close"
    return f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n{framing}\r\n\r\n".encode()


def _endless(unit: bytes) -> Iterator[bytes]:
    """``unit`` repeated, a chunk at a time, up to the server's cap."""
    chunk = unit * (CHUNK // len(unit))
    for _ in range(SERVER_CAP // len(chunk)):
        yield chunk


def _stopped_early(server: RawServer) -> None:
    """The client hung up after reading about its bound, not at the end of what it was sent."""
    wait_until(lambda: server.sent, 10, what="the server to see the client hang up")
    assert server.sent[0] < SERVER_CAP // 2


def _endless_json(path: str) -> tuple[bytes, Iterator[bytes]]:
    # A JSON string that never ends, without a length: read until the server closes.
    def body() -> Iterator[bytes]:
        yield b'{"agents": ["'
        yield from _endless(b"a")

    return _head("application/json"), body()


def test_an_endless_answer_stops_at_the_bound(serve: Callable[[Answer], RawServer]) -> None:
    server = serve(_endless_json)
    with ApiClient(server.url, key="k", max_answer_bytes=LIMIT) as client:
        with pytest.raises(AnswerTooLarge) as raised:
            client.agents()
    assert (raised.value.status, raised.value.kind) == (200, "answer_too_large")
    assert raised.value.details == {"max_answer_bytes": LIMIT}
    assert f"larger than {LIMIT} bytes" in str(raised.value)
    _stopped_early(server)


def test_an_endless_answer_stops_at_the_bound_in_the_async_client(
    serve: Callable[[Answer], RawServer],
) -> None:
    server = serve(_endless_json)

    async def read() -> None:
        async with AsyncClient(server.url, key="k", max_answer_bytes=LIMIT) as client:
            await client.agents()

    with pytest.raises(AnswerTooLarge):
        asyncio.run(read())
    _stopped_early(server)


def test_a_declared_length_over_the_bound_is_refused_before_its_body(
    serve: Callable[[Answer], RawServer],
) -> None:
    server = serve(lambda path: (_head("application/json", SERVER_CAP), _endless(b"a")))
    with ApiClient(server.url, key="k", max_answer_bytes=LIMIT) as client:
        with pytest.raises(AnswerTooLarge):
            client.agents()
    _stopped_early(server)


def test_an_error_answer_is_bounded_too(serve: Callable[[Answer], RawServer]) -> None:
    def error(path: str) -> tuple[bytes, Iterator[bytes]]:
        head = b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
        return head, _endless(b"e")

    server = serve(error)
    with ApiClient(server.url, key="k", max_answer_bytes=LIMIT) as client:
        with pytest.raises(AnswerTooLarge) as raised:
            client.agents()
        assert raised.value.status == 500
        with pytest.raises(AnswerTooLarge):
            list(client.handle("r1").events(idle_timeout=10))  # a stream refused with an endless body
    _stopped_early(server)


def test_answers_within_the_bound_read_as_ever(serve: Callable[[Answer], RawServer]) -> None:
    body = json.dumps({"agents": []}).encode()
    server = serve(lambda path: (_head("application/json", len(body)), iter([body])))
    with ApiClient(server.url, key="k", max_answer_bytes=len(body)) as client:
        assert client.agents() == []
    with ApiClient(server.url, key="k", max_answer_bytes=len(body) - 1) as client:
        with pytest.raises(AnswerTooLarge):
            client.agents()


def _stream(first: Iterator[bytes]) -> Answer:
    """The first request of the events gets ``first``; any later one (a resume) a 404."""
    answered: list[str] = []

    def answer(path: str) -> tuple[bytes, Iterator[bytes]]:
        if answered:
            body = b'{"error": {"kind": "not_found", "message": "no such run", "details": {}}}'
            head = f"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
            return f"{head}\r\n\r\n".encode(), iter([body])
        answered.append(path)
        return _head("text/event-stream"), first

    return answer


def _endless_line() -> Iterator[bytes]:
    yield b"data: "
    yield from _endless(b"x")


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(_endless_line, id="an endless line"),
        pytest.param(lambda: _endless(b"data: " + b"x" * 1000 + b"\n"), id="an event that never ends"),
        pytest.param(lambda: _endless(b": keep-alive " + b"x" * 1000), id="an endless comment"),
    ],
)
def test_an_endless_event_stream_line_or_event_stops_at_the_bound(
    serve: Callable[[Answer], RawServer], body: Callable[[], Iterator[bytes]]
) -> None:
    server = serve(_stream(body()))
    with ApiClient(server.url, key="k", max_event_chars=LIMIT) as client:
        with pytest.raises(AnswerTooLarge) as raised:
            list(client.handle("r1").events(idle_timeout=10))
    assert raised.value.details == {"max_event_chars": LIMIT}
    assert "event stream of run r1" in raised.value.message
    _stopped_early(server)


def test_an_endless_event_stream_line_stops_at_the_bound_in_the_async_client(
    serve: Callable[[Answer], RawServer],
) -> None:
    server = serve(_stream(_endless_line()))

    async def follow() -> list[Any]:
        async with AsyncClient(server.url, key="k", max_event_chars=LIMIT) as client:
            return [event async for event in client.handle("r1").events(idle_timeout=10)]

    with pytest.raises(AnswerTooLarge):
        asyncio.run(follow())
    _stopped_early(server)


def test_events_within_the_bound_read_as_ever(serve: Callable[[Answer], RawServer]) -> None:
    end = Completed(run_id="r1", step=1, answer="a" * 500, usage=Usage())
    data = json.dumps({**end.model_dump(mode="json"), "id": "5-0"})
    frame = f": keep-alive\n\ndata: {data}\n\n".encode()
    longest = len(f"data: {data}")  # the bound is on lines as they come, field name included
    server = serve(lambda path: (_head("text/event-stream"), iter([frame[:7], frame[7:]])))
    with ApiClient(server.url, key="k", max_event_chars=longest) as client:
        events = list(client.handle("r1").events(idle_timeout=10))
        assert [(e.kind, e.stream_id) for e in events] == [("Completed", "5-0")]
    with ApiClient(server.url, key="k", max_event_chars=longest - 1) as client:
        with pytest.raises(AnswerTooLarge):
            list(client.handle("r1").events(idle_timeout=10))
