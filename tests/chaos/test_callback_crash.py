"""The worker that commits a run's end is SIGKILLed right after the commit: the completion callback
is delivered anyway, once. Either the commit script queued the callback task itself (Redis broker,
the default), or the worker died before sending it and the sweeper hands it on."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from producer.client import Client
from shared.state import Phase
from shared.tenants import Tenants
from shared.webhooks import verify
from tests.broker import commit_publishes, on_rabbitmq
from tests.chaos.faults import fired_key
from tests.chaos.support import RUN_TIMEOUT_S, Cluster
from tests.harness import free_port, wait_until


@pytest.mark.parametrize("commit_publish", ["1", "0"], ids=["commit+publish", "commit-then-publish"])
def test_the_callback_survives_a_crash_between_the_end_and_its_delivery(
    cluster: Cluster, client: Client, commit_publish: str
) -> None:
    secret = Tenants(client.store.redis, client.store.keys).webhook_secret("acme")
    received: list[tuple[str, bool, dict[str, Any]]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            headers = {k.lower(): v for k, v in self.headers.items()}
            received.append((headers["webhook-id"], verify(secret, headers, body), json.loads(body)))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        env = {
            "WESICHAIN_FAULT": "crash_after_commit:thinking",
            "WESICHAIN_WEBHOOK_ALLOW_PRIVATE": "1",
            "WESICHAIN_COMMIT_PUBLISH": commit_publish,
        }
        workers = cluster.start(2, pool="solo", env=env)
        url = f"http://127.0.0.1:{http.server_address[1]}/done"
        handle = client.submit("direct", "hi", tenant="acme", callback={"url": url})
        head = handle.wait(RUN_TIMEOUT_S)
        assert head.phase is Phase.COMPLETED
        # It kills itself right after the commit: wait for that, the run's end may be seen first
        # (and before that, the fault's record of the pid it fired in).
        wait_until(lambda: sum(not w.alive for w in workers) == 1, 30, what="the committing worker to die")
        crashed = client.store.redis.get(fired_key("crash_after_commit:thinking", handle.run_id))
        assert crashed is not None and int(crashed) in {w.main_pids[0] for w in workers}
        state = wait_until(
            lambda: (s := handle.callback()) is not None and s.status == "delivered" and s,
            RUN_TIMEOUT_S,
            what="the callback to be delivered after the crash",
        )
        assert state.attempts == 1
        assert [(run_id, signed) for run_id, signed, _ in received] == [(handle.run_id, True)]
        assert received[0][2]["answer"] == "The answer is 42."
        if commit_publish == "1" and commit_publishes(cluster.server.url):
            assert handle.status().epoch == 0, "the terminal commit queued the callback task itself"
        elif on_rabbitmq():
            # RabbitMQ handed the committing task back at once; its redelivery sent the callback.
            assert handle.status().epoch == 0, "the redelivery should have sent the callback task"
        else:
            assert handle.status().epoch >= 1, "the sweeper handed the undelivered callback on"
    finally:
        http.shutdown()
        http.server_close()
