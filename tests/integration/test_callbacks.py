"""Services learn that a run ended without polling: a signed webhook, or a Celery task by name.

Real parts: a redis-server, real workers, a webhook receiver on loopback that fails its first two
deliveries and checks every signature, and a separate plain Celery app (it imports nothing from
this project) that consumes the Celery callback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import standardwebhooks

from producer.client import Client, RequestConflict
from shared.state import Callback, Phase
from shared.tenants import Tenants
from shared.webhooks import verify
from tests.api_support import ApiProcess, bearer
from tests.broker import Settings
from tests.harness import RedisServer, WorkerProcess, free_port, running, wait_until

TIMEOUT = 60
ENV = {"WESICHAIN_WEBHOOK_ALLOW_PRIVATE": "1", "WESICHAIN_WEBHOOK_RETRY_S": "0.2,0.5,1"}


@dataclass
class Delivery:
    webhook_id: str
    signed: bool
    status: int
    body: dict[str, Any]


@dataclass
class Receiver:
    """Answers 500 to the first ``fail_first`` deliveries of each webhook id, then 200."""

    secret: str
    fail_first: int = 2
    deliveries: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, run_id: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if d.webhook_id == run_id]


@dataclass
class Setup:
    server: RedisServer
    client: Client
    receiver: Receiver
    url: str


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    server = RedisServer().start()
    client = Client(Settings(redis_url=server.url, agents_module="tests.agents_fixture"))
    secret = Tenants(client.store.redis, client.store.keys).webhook_secret("acme")
    receiver = Receiver(secret)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            headers = {k.lower(): v for k, v in self.headers.items()}
            with receiver.lock:
                seen = sum(1 for d in receiver.deliveries if d.webhook_id == headers.get("webhook-id"))
                status = 500 if seen < receiver.fail_first else 200
                signed = verify(secret, headers, body) and _standard_webhooks_accepts(secret, headers, body)
                receiver.deliveries.append(
                    Delivery(headers.get("webhook-id", ""), signed, status, json.loads(body))
                )
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    log_dir = str(tmp_path_factory.mktemp("callback-workers"))
    workers = [WorkerProcess(f"cb{i}", server.url, concurrency=2, env=ENV, log_dir=log_dir) for i in (1, 2)]
    try:
        with running(workers):
            yield Setup(server, client, receiver, f"http://127.0.0.1:{http.server_address[1]}/hooks/runs")
    finally:
        http.shutdown()
        http.server_close()
        client.close()
        server.cleanup()


def _standard_webhooks_accepts(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """Whether the Standard Webhooks reference library verifies the delivery (id, time, signature)."""
    try:
        standardwebhooks.Webhook(secret).verify(body, headers)
    except standardwebhooks.WebhookVerificationError:
        return False
    return True


def _delivered(handle: Any) -> Any:
    state = handle.callback()
    return state if state is not None and state.status == "delivered" else None


def test_a_webhook_is_signed_retried_and_accepted_once(setup: Setup) -> None:
    handles = [
        setup.client.submit(agent, "go", tenant="acme", callback={"url": setup.url})
        for agent in ("one_hop", "tool_error_fail")
    ]
    for handle in handles:
        head = handle.wait(TIMEOUT)
        state = wait_until(partial(_delivered, handle), TIMEOUT, what="the webhook to be delivered")
        deliveries = setup.receiver.of(handle.run_id)
        # Two refused, then one accepted, all with the same id and a valid signature.
        assert [d.status for d in deliveries] == [500, 500, 200]
        assert all(d.signed for d in deliveries)
        assert state.attempts == 3 and state.last_status_code == 200 and state.delivered_at is not None
        body = deliveries[-1].body
        assert body["type"] == "run.ended" and body["run_id"] == handle.run_id and body["tenant"] == "acme"
        assert body["status"] == head.phase.value
        if head.phase is Phase.COMPLETED:
            assert body["answer"] == "1 + 2 = 3" and body["error"] is None
        else:
            assert body["error"]["kind"] == "ToolDispatch"
        assert all(d.body == body for d in deliveries), "every attempt carries the same body"


def test_a_webhook_is_sent_once_per_run(setup: Setup) -> None:
    handle = setup.client.submit("direct", "hi", tenant="acme", callback={"url": setup.url})
    handle.wait(TIMEOUT)
    wait_until(
        lambda: (s := handle.callback()) is not None and s.status == "delivered", TIMEOUT, what="delivery"
    )
    accepted = [d for d in setup.receiver.of(handle.run_id) if d.status == 200]
    assert len(accepted) == 1
    # The run's end, delivered again (a duplicate of its last task), sends nothing more.
    head = handle.status()
    setup.client.app.send_task(
        "wesichain.callback",
        kwargs={
            "run_id": handle.run_id,
            "step": head.step,
            "version": head.version,
            "phase": head.phase.value,
        },
        queue="wesichain.callbacks",
    )
    setup.client.submit("direct", "a later run flushes the queue behind it", tenant="acme").wait(TIMEOUT)
    assert len(setup.receiver.of(handle.run_id)) == 3


CONSUMER = """
import json, sys
from celery import Celery
url, out = sys.argv[1], sys.argv[2]
app = Celery("billing", broker=url)

@app.task(name="billing.on_agent_done")
def on_agent_done(outcome):
    with open(out, "a") as f:
        f.write(json.dumps(outcome) + "\\n")

app.worker_main(
    ["worker", "--pool=solo", "-Q", "billing", "--without-mingle", "--without-gossip", "-l", "INFO"]
)
"""


@pytest.mark.redis_broker  # the plain app's broker is the run state's Redis
def test_a_celery_callback_reaches_a_plain_celery_app(setup: Setup, tmp_path: Path) -> None:
    out = tmp_path / "outcomes.jsonl"
    log = open(tmp_path / "consumer.log", "wb")  # closed below
    consumer = subprocess.Popen(
        [sys.executable, "-I", "-c", CONSUMER, setup.server.url, str(out)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    try:
        wait_until(
            lambda: b"ready." in (tmp_path / "consumer.log").read_bytes(), TIMEOUT, what="the consumer"
        )
        callback = {"task": "billing.on_agent_done", "queue": "billing"}
        handle = setup.client.submit("one_hop", "bill me", callback=callback)
        head = handle.wait(TIMEOUT)
        wait_until(lambda: out.exists() and out.read_text().strip(), TIMEOUT, what="the callback task to run")
        (line,) = out.read_text().splitlines()
        outcome = json.loads(line)
        assert outcome["run_id"] == handle.run_id and outcome["status"] == "completed"
        assert outcome["answer"] == head.answer == "1 + 2 = 3" and outcome["tenant"] is None
        # The worker records the delivery right after it sent the task, which the consumer may
        # have run already: on a loaded machine that record can come a moment later.
        state = wait_until(lambda: _delivered(handle), TIMEOUT, what="the delivery to be recorded")
        assert state.attempts == 1
    finally:
        consumer.terminate()
        consumer.wait(timeout=20)
        log.close()


SENDER = """
import json, sys
from celery import Celery
app = Celery(broker=sys.argv[1])
for kwargs in json.loads(sys.stdin.read()):
    app.send_task("wesichain.start", kwargs=kwargs, queue="wesichain.model")
"""


def _plain_python_env() -> dict[str, str]:
    """An environment in which nothing of this checkout is importable (with ``python -I``)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.mark.redis_broker  # the plain apps' broker is the run state's Redis
def test_a_bare_start_message_keeps_its_tenant_and_callbacks(setup: Setup, tmp_path: Path) -> None:
    """A service with nothing but Celery starts runs with a tenant and a callback (a Celery task,
    a webhook): the runs are the tenant's, and each callback arrives once."""
    out = tmp_path / "outcomes.jsonl"
    log = open(tmp_path / "consumer.log", "wb")  # closed below
    consumer = subprocess.Popen(
        [sys.executable, "-I", "-c", CONSUMER, setup.server.url, str(out)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=_plain_python_env(),
    )
    try:
        wait_until(
            lambda: b"ready." in (tmp_path / "consumer.log").read_bytes(), TIMEOUT, what="the consumer"
        )
        by_task, by_url, flush = (f"bare-{uuid.uuid4().hex}" for _ in range(3))
        task_callback = {"task": "billing.on_agent_done", "queue": "billing"}
        messages = [
            {
                "run_id": by_task,
                "create": {
                    "agent": "one_hop",
                    "input": "bill me",
                    "tenant": "acme",
                    "callback": task_callback,
                },
            },
            {
                "run_id": by_url,
                "create": {
                    "agent": "direct",
                    "input": "tell me",
                    "tenant": "acme",
                    "callback": {"url": setup.url},
                },
            },
        ]
        sent = subprocess.run(
            [sys.executable, "-I", "-c", SENDER, setup.server.url],
            input=json.dumps(messages),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env=_plain_python_env(),
        )
        assert sent.returncode == 0, sent.stderr
        for run_id in (by_task, by_url):

            def created(run_id: str = run_id) -> bool:
                return setup.client.store.load(run_id) is not None

            wait_until(created, TIMEOUT, what="the run to be created")
            head = setup.client.handle(run_id).wait(TIMEOUT)
            assert head.phase is Phase.COMPLETED and head.tenant == "acme"
        assert setup.client.handle(by_task).status().callback == Callback(
            task="billing.on_agent_done", queue="billing"
        )
        assert setup.client.handle(by_url).status().callback == Callback(url=setup.url)
        assert {h.run_id for h in setup.client.list_runs(tenant="acme", limit=500).runs} >= {by_task, by_url}

        # The Celery callback: run once by the plain app, with the tenant in the outcome.
        wait_until(lambda: out.exists() and out.read_text().strip(), TIMEOUT, what="the callback task to run")
        wait_until(lambda: _delivered(setup.client.handle(by_task)), TIMEOUT, what="the task to be recorded")
        # The webhook: refused twice by the receiver, then accepted once, signed with acme's secret.
        state = wait_until(lambda: _delivered(setup.client.handle(by_url)), TIMEOUT, what="the webhook")
        assert state.attempts == 3
        # A later run's callback on the same queue, behind them: nothing more comes for the two.
        sent = subprocess.run(
            [sys.executable, "-I", "-c", SENDER, setup.server.url],
            input=json.dumps(
                [{"run_id": flush, "create": {"agent": "direct", "input": "x", "callback": task_callback}}]
            ),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env=_plain_python_env(),
        )
        assert sent.returncode == 0, sent.stderr
        wait_until(lambda: flush in out.read_text(), TIMEOUT, what="the later run's callback")
        outcomes = [json.loads(line) for line in out.read_text().splitlines()]
        (outcome,) = [o for o in outcomes if o["run_id"] == by_task]
        assert (
            outcome["tenant"] == "acme"
            and outcome["status"] == "completed"
            and outcome["answer"] == "1 + 2 = 3"
        )
        deliveries = setup.receiver.of(by_url)
        assert [d.status for d in deliveries] == [500, 500, 200] and all(d.signed for d in deliveries)
        assert deliveries[-1].body["tenant"] == "acme" and deliveries[-1].body["run_id"] == by_url
    finally:
        consumer.terminate()
        consumer.wait(timeout=20)
        log.close()


def test_an_idempotency_key_gives_the_same_run(setup: Setup) -> None:
    first = setup.client.submit("direct", "once", tenant="acme", idempotency_key="order-17")
    again = setup.client.submit("direct", "once", tenant="acme", idempotency_key="order-17")
    assert again.run_id == first.run_id
    assert first.wait(TIMEOUT).phase is Phase.COMPLETED
    # The same key for another tenant is another run; for another request, a conflict.
    other = setup.client.submit("direct", "once", tenant="globex", idempotency_key="order-17")
    assert other.run_id != first.run_id
    with pytest.raises(RequestConflict, match="order-17"):
        setup.client.submit("direct", "something else", tenant="acme", idempotency_key="order-17")
    assert [h.run_id for h in setup.client.list_runs(tenant="acme", agent="direct").runs].count(
        first.run_id
    ) == 1


def test_a_webhook_named_over_the_http_api_is_delivered_and_shown_on_the_run(setup: Setup) -> None:
    """The same webhook through the HTTP API: named in the submit, or the tenant's default."""
    tenants = Tenants(setup.client.store.redis, setup.client.store.keys)
    key, _ = tenants.create_key("acme")
    tenants.set_default_callback("acme", setup.url)  # before the API first reads it (kept 5 s)
    api = ApiProcess(setup.server.url, env=ENV).start()
    try:
        with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
            named = http.post(
                "/v1/runs", json={"agent": "direct", "input": "hi", "callback": {"url": setup.url}}
            )
            assert named.status_code == 202, named.text
            by_default = http.post("/v1/runs", json={"agent": "one_hop", "input": "hi"})
            assert by_default.status_code == 202 and by_default.json()["callback"]["url"] == setup.url
            for run_id in (named.json()["run_id"], by_default.json()["run_id"]):

                def delivered(run_id: str = run_id) -> dict[str, Any] | None:
                    view: dict[str, Any] = http.get(f"/v1/runs/{run_id}").json()
                    return view if (view["callback_delivery"] or {}).get("status") == "delivered" else None

                view = wait_until(delivered, TIMEOUT, what="the webhook to be delivered")
                assert view["callback_delivery"]["attempts"] == 3
                assert view["callback_delivery"]["last_status_code"] == 200
                deliveries = setup.receiver.of(run_id)
                assert [d.status for d in deliveries] == [500, 500, 200] and all(d.signed for d in deliveries)
                assert (
                    deliveries[-1].body["tenant"] == "acme" and deliveries[-1].body["status"] == "completed"
                )
    finally:
        tenants.set_default_callback("acme", None)
        api.stop()
