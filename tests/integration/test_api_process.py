"""The suite's API process is the one that answers on its port (``worker.testing.api``)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from tests.api_support import ApiProcess
from tests.harness import RedisServer


class _Healthy(BaseHTTPRequestHandler):
    """Any server answering ``/healthz`` with 200: one of a test running beside this one."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_an_api_whose_port_another_server_holds_starts_on_another_port(redis_server: RedisServer) -> None:
    # Two test processes given the same free port: the API that lost the bind took the other's
    # /healthz for its own, and its test's requests went to a server of another Redis (a 503).
    squatter = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    serving = threading.Thread(target=squatter.serve_forever, daemon=True)
    serving.start()
    taken = squatter.server_address[1]
    api = ApiProcess(redis_server.url)
    api.port = taken
    try:
        api.start()
        assert api.port != taken
        # This API's own answer (no key: 401), not the other server's 200.
        assert httpx.get(f"{api.url}/v1/runs", timeout=30).status_code == 401
    finally:
        api.stop()
        squatter.shutdown()
        squatter.server_close()
