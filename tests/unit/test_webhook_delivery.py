"""A webhook delivery connects only to the address its check passed, names the URL's host in the
request and in TLS, and goes through no proxy.

Resolution is faked (``socket.getaddrinfo``) and receivers listen on 127.0.0.1; where a delivery
would connect to a public address, ``socket.create_connection`` refuses anything but loopback,
so nothing leaves the machine.
"""

from __future__ import annotations

import errno
import ipaddress
import shutil
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest

from shared.settings import Settings
from shared.state import Callback, Phase, RunHead
from shared.webhook_client import webhook_client
from shared.webhooks import new_secret, verify
from tests.tls_support import issue, make_ca
from worker import callback
from worker.runtime import Runtime

REAL_GETADDRINFO = socket.getaddrinfo
REAL_CREATE_CONNECTION = socket.create_connection
PUBLIC = "93.184.215.14"  # never connected to: the guard below refuses it


@dataclass
class Receiver:
    port: int
    requests: list[dict[str, str]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    server_names: list[str | None] = field(default_factory=list)


def _serve(tls: ssl.SSLContext | None = None) -> tuple[ThreadingHTTPServer, Receiver]:
    receiver = Receiver(0)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            receiver.bodies.append(self.rfile.read(int(self.headers["content-length"])))
            receiver.requests.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:

        def note_server_name(_sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
            receiver.server_names.append(name)

        tls.sni_callback = note_server_name
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    receiver.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server, receiver = _serve()
    yield receiver
    server.shutdown()
    server.server_close()


class Dns:
    """``socket.getaddrinfo`` for names of this test: each lookup of a name takes the next of its
    answers (the last one repeats). IP literals resolve as usual, without a lookup."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def __call__(
        self, host: str, port: int, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
    ) -> Any:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            return REAL_GETADDRINFO(host, port, family, type, proto, flags | socket.AI_NUMERICHOST)
        answers = self.answers.get(host)
        if answers is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        ips = answers[min(self.asked.count(host), len(answers) - 1)]
        self.asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (ip, port)) for ip in ips]


@pytest.fixture
def refused(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Connections reach loopback only, like socket.create_connection (which resolves its host,
    through the fake resolver); the other addresses asked for are listed here."""
    asked: list[tuple[str, int]] = []

    def create_connection(address: tuple[str, int], timeout: Any = None, source_address: Any = None) -> Any:
        host, port = address
        for *_, sockaddr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
            ip = str(sockaddr[0])
            if ipaddress.ip_address(ip).is_loopback:
                return REAL_CREATE_CONNECTION((ip, port), timeout, source_address)
            asked.append((ip, port))
        raise OSError(errno.ENETUNREACH, "only loopback is reachable in this test")

    monkeypatch.setattr(socket, "create_connection", create_connection)
    return asked


def _runtime(monkeypatch: pytest.MonkeyPatch, *, allow_private: bool) -> Runtime:
    monkeypatch.setattr(callback, "_clients", {})  # a client of this test's own
    settings = Settings(
        webhook_secret=new_secret(), webhook_allow_private=allow_private, webhook_timeout_s=10
    )
    return cast(Runtime, SimpleNamespace(settings=settings))


def _head(url: str) -> RunHead:
    return RunHead(
        run_id="r-webhook",
        agent="direct",
        phase=Phase.COMPLETED,
        input="x",
        callback=Callback(url=url),
        created_at=1.0,
        updated_at=2.0,
    )


def test_a_name_that_rebinds_to_loopback_after_the_check_does_not_reach_it(
    monkeypatch: pytest.MonkeyPatch, receiver: Receiver, refused: list[tuple[str, int]]
) -> None:
    # Public to the first lookup, loopback (where the receiver listens) to any later one.
    dns = Dns({"hooks.example.test": [[PUBLIC], ["127.0.0.1"]]})
    monkeypatch.setattr(socket, "getaddrinfo", dns)
    rt = _runtime(monkeypatch, allow_private=False)
    head = _head(f"http://hooks.example.test:{receiver.port}/hooks/runs")
    assert head.callback is not None
    error, status = callback._deliver(rt, head, head.callback)
    assert receiver.requests == []
    assert dns.asked == ["hooks.example.test"]  # resolved once
    assert refused == [(PUBLIC, receiver.port)]  # the connection went to the checked address
    assert status is None and error is not None and error.startswith("ConnectError: ")


def test_a_name_that_reaches_a_private_address_is_not_connected_to(
    monkeypatch: pytest.MonkeyPatch, receiver: Receiver, refused: list[tuple[str, int]]
) -> None:
    dns = Dns({"hooks.example.test": [[PUBLIC, "64:ff9b::7f00:1"]]})
    monkeypatch.setattr(socket, "getaddrinfo", dns)
    rt = _runtime(monkeypatch, allow_private=False)
    head = _head(f"http://hooks.example.test:{receiver.port}/hooks/runs")
    assert head.callback is not None
    error, status = callback._deliver(rt, head, head.callback)
    assert (error, status) == (
        "webhook host 'hooks.example.test' reaches 64:ff9b::7f00:1, which is not a public address"
        " (allow private webhook addresses in the deployment's settings to use it)",
        None,
    )
    assert refused == [] and receiver.requests == []


def test_an_allowed_private_receiver_gets_the_signed_post_with_its_host_name(
    monkeypatch: pytest.MonkeyPatch, receiver: Receiver, refused: list[tuple[str, int]]
) -> None:
    dns = Dns({"receiver.example.test": [["127.0.0.1"]]})
    monkeypatch.setattr(socket, "getaddrinfo", dns)
    rt = _runtime(monkeypatch, allow_private=True)
    head = _head(f"http://receiver.example.test:{receiver.port}/hooks/runs")
    assert head.callback is not None
    assert callback._deliver(rt, head, head.callback) == (None, 204)
    (request,) = receiver.requests
    assert request["host"] == f"receiver.example.test:{receiver.port}"
    assert request["webhook-id"] == "r-webhook"
    assert verify(rt.settings.webhook_secret, request, receiver.bodies[0])
    assert dns.asked == ["receiver.example.test"] and refused == []


def test_proxies_from_the_environment_are_not_used(
    monkeypatch: pytest.MonkeyPatch, receiver: Receiver, refused: list[tuple[str, int]]
) -> None:
    proxy_server, proxy = _serve()
    try:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
        monkeypatch.setattr(socket, "getaddrinfo", Dns({"receiver.example.test": [["127.0.0.1"]]}))
        rt = _runtime(monkeypatch, allow_private=True)
        head = _head(f"http://receiver.example.test:{receiver.port}/hooks/runs")
        assert head.callback is not None
        assert callback._deliver(rt, head, head.callback) == (None, 204)
        assert len(receiver.requests) == 1 and proxy.requests == []
    finally:
        proxy_server.shutdown()
        proxy_server.server_close()


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    """A CA, and a certificate of it for hooks.example.test only (no IP address in it)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    directory = tmp_path_factory.mktemp("webhook-pki")
    ca = make_ca(Path(directory), "ca")
    usage = "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
    cert, key = issue(
        Path(directory),
        "hooks",
        ca,
        usage + "subjectAltName=DNS:hooks.example.test\nextendedKeyUsage=serverAuth\n",
    )
    return ca[0], cert, key


def test_tls_names_and_verifies_the_url_host_while_connecting_to_the_checked_address(
    monkeypatch: pytest.MonkeyPatch, certificates: tuple[str, str, str], refused: list[tuple[str, int]]
) -> None:
    ca, cert, key = certificates
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    server, receiver = _serve(tls)
    try:
        names = {"hooks.example.test": [["127.0.0.1"]], "other.example.test": [["127.0.0.1"]]}
        monkeypatch.setattr(socket, "getaddrinfo", Dns(names))
        trust = ssl.create_default_context(cafile=ca)
        with webhook_client(timeout_s=10, allow_private=True, ssl_context=trust) as client:
            response = client.post(f"https://hooks.example.test:{receiver.port}/hooks/runs", content=b"{}")
            assert response.status_code == 204
            assert receiver.server_names == ["hooks.example.test"]
            assert receiver.requests[0]["host"] == f"hooks.example.test:{receiver.port}"
            # Same address, another name: the certificate is checked against the name, and fails.
            with pytest.raises(httpx.ConnectError, match="certificate verify failed"):
                client.post(f"https://other.example.test:{receiver.port}/hooks/runs", content=b"{}")
            assert len(receiver.requests) == 1
        assert refused == []
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def tarpit(answer: Callable[[socket.socket, threading.Event], None]) -> Iterator[int]:
    """A receiver on loopback that reads a request's head, then answers with ``answer`` until the
    client hangs up (or the test ends); yields its port."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.settimeout(5)
            try:
                while b"\r\n\r\n" not in conn.recv(65536):
                    pass
                answer(conn, stop)
            except OSError:
                pass  # the client hung up: what a delivery with a deadline does

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        server.close()
        thread.join(10)


def _slow_head(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    while not stop.wait(0.2):  # a header byte now and then, each well within the read timeout
        conn.sendall(b"x")


def _endless_body(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"10000\r\n" + b"x" * 65536 + b"\r\n"
    while not stop.is_set():
        conn.sendall(chunk)


def test_a_receiver_that_sends_its_answer_a_byte_at_a_time_is_cut_off_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """httpx's timeout bounds each read: a receiver sending a byte every 0.2 s held the delivery,
    and the worker's slot, for as long as it liked. The exchange has one deadline now."""
    monkeypatch.setattr(callback, "_clients", {})
    settings = Settings(webhook_secret=new_secret(), webhook_allow_private=True, webhook_timeout_s=1)
    rt = cast(Runtime, SimpleNamespace(settings=settings))
    with tarpit(_slow_head) as port:
        head = _head(f"http://127.0.0.1:{port}/hooks/runs")
        assert head.callback is not None
        error, status = callback._deliver(rt, head, head.callback)
    assert status is None and error is not None and error.startswith("ReadTimeout: "), error


def test_a_receivers_answer_body_is_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the status says anything: an endless body once took the delivery to gigabytes."""
    rt = _runtime(monkeypatch, allow_private=True)
    with tarpit(_endless_body) as port:
        head = _head(f"http://127.0.0.1:{port}/hooks/runs")
        assert head.callback is not None
        assert callback._deliver(rt, head, head.callback) == (None, 200)
