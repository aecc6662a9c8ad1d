"""Redis over TLS: the store and the broker both verify the server, and a mismatch stops a worker.

A private CA and a certificate for 127.0.0.1 are made with openssl; redis-server listens with TLS
only. A second, unrelated CA stands for a wrong CA file (or a server posing as Redis).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from celery import Celery
from kombu.exceptions import OperationalError

from producer import cli
from producer.client import Client
from shared import tls
from shared.events import Event
from shared.redis_client import check_tls, connect
from shared.settings import ENV_REDIS_CA_FILE, ENV_REDIS_URL, celery_config
from shared.state import Phase
from shared.tls import RedisTlsError
from tests.broker import Settings
from tests.harness import RedisServer, ServerTls, WorkerProcess, free_port, wait_until
from tests.tls_support import issue, make_ca

pytestmark = pytest.mark.redis_broker

TIMEOUT = 60
PASSWORD = "hunter2-tls"
#: The Celery queue of the phase tasks in Redis (kombu's list, under the global key prefix).
MODEL_QUEUE_KEY = "wesichain.model"


@dataclass(frozen=True)
class Pki:
    ca: str
    other_ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory, "ca")
    other_ca, _ = make_ca(directory, "other-ca")
    usage = "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
    server = issue(
        directory, "server", ca, usage + "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
    )
    client = issue(directory, "client", ca, usage + "extendedKeyUsage=clientAuth\n")
    return Pki(ca[0], other_ca, server[0], server[1], client[0], client[1])


def _server(pki: Pki, *, auth_clients: bool = False) -> RedisServer:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    tls = ServerTls(
        pki.server_cert,
        pki.server_key,
        pki.ca,
        auth_clients=auth_clients,
        client_cert_file=pki.client_cert,
        client_key_file=pki.client_key,
    )
    return RedisServer(tls=tls).start()


@pytest.fixture(scope="module")
def tls_redis(pki: Pki) -> Iterator[RedisServer]:
    """TLS only (``--port 0``); clients need not present a certificate."""
    server = _server(pki)
    yield server
    server.cleanup()


@pytest.fixture
def url(tls_redis: RedisServer) -> str:
    """The server's URL with a password, which must never be printed (any password passes
    ``AUTH default``: the server sets none)."""
    return tls_redis.url.replace("rediss://", f"rediss://default:{PASSWORD}@")


def _redacted(url: str) -> str:
    return url.replace(PASSWORD, "***")


def _run_and_events(client: Client, agent: str) -> tuple[Phase, str | None, list[Event]]:
    handle = client.submit(agent, "over TLS")
    head = handle.wait(TIMEOUT)
    return head.phase, head.answer, list(handle.events(follow=False))


# -- (1) a verified run end to end ----------------------------------------------------------------


def test_worker_and_client_complete_a_run_over_verified_tls(
    url: str, pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = WorkerProcess("tls-ok", url, env={ENV_REDIS_CA_FILE: pki.ca}, log_dir=str(tmp_path))
    try:
        worker.start()
        # The CA from the environment, as a deployment sets it.
        monkeypatch.setenv(ENV_REDIS_CA_FILE, pki.ca)
        client = Client.from_env(redis_url=url)
        try:
            # A model phase and a tool phase: tasks cross both queues through the broker.
            phase, answer, events = _run_and_events(client, "tool_error_continue")
        finally:
            client.close()
        assert (phase, answer) == (Phase.COMPLETED, "recovered from the tool error")
        assert [e.kind for e in events if e.kind.startswith("Tool")] == ["ToolDispatched", "ToolCompleted"]

        # The CA as the URL's ssl_ca_certs parameter (the redis-py and kombu spelling).
        monkeypatch.delenv(ENV_REDIS_CA_FILE)
        in_url = Client(Settings(redis_url=f"{url}?ssl_ca_certs={quote(pki.ca)}"))
        try:
            phase, answer, _ = _run_and_events(in_url, "direct")
        finally:
            in_url.close()
        assert (phase, answer) == (Phase.COMPLETED, "The answer is 42.")
    finally:
        worker.stop()
    log = worker.log()
    assert "defaulting to insecure SSL behaviour" not in log
    assert PASSWORD not in log


# -- (2) another CA: the worker refuses to start, the producer gets a clear error -------------------


def test_worker_with_another_ca_exits_before_consuming(
    url: str, pki: Pki, tls_redis: RedisServer, tmp_path: Path
) -> None:
    good = Client(Settings(redis_url=url, redis_ca_file=pki.ca))
    raw = tls_redis.client()
    try:
        raw.delete(MODEL_QUEUE_KEY)
        handle = good.submit("direct", "waits for a worker that trusts the server", check_agent=False)
        assert raw.llen(MODEL_QUEUE_KEY) == 1

        bad = WorkerProcess("tls-bad", url, env={ENV_REDIS_CA_FILE: pki.other_ca}, log_dir=str(tmp_path))
        bad.start(wait=False)
        try:
            assert bad.proc is not None
            returncode = bad.proc.wait(timeout=TIMEOUT)
        finally:
            bad.stop()
        log = bad.log()
        assert returncode == 2, log
        assert (
            f"wesichain: refusing to start the worker: TLS verification of Redis at {_redacted(url)} failed:"
            " certificate verify failed: "
        ) in log
        assert f"(trusting the CA file {pki.other_ca})" in log
        assert PASSWORD not in log
        assert "Traceback" not in log
        assert "ready." not in log and "Connected to" not in log

        # Nothing was consumed: the start message is still queued and the run never began.
        assert raw.llen(MODEL_QUEUE_KEY) == 1
        head = handle.status()
        assert (head.phase, head.version) == (Phase.IDLE, 1)
        assert list(handle.events(follow=False)) == []

        # The message is intact: a worker that trusts the server runs it.
        ok = WorkerProcess("tls-after", url, env={ENV_REDIS_CA_FILE: pki.ca}, log_dir=str(tmp_path))
        ok.start()
        try:
            head = handle.wait(TIMEOUT)
        finally:
            ok.stop()
        assert (head.phase, head.answer) == (Phase.COMPLETED, "The answer is 42.")
    finally:
        raw.close()
        good.close()


def test_client_with_another_ca_gets_a_clear_error(url: str, pki: Pki) -> None:
    client = Client(Settings(redis_url=url, redis_ca_file=pki.other_ca))
    try:
        with pytest.raises(RedisTlsError) as info:
            client.submit("direct", "hi")
    finally:
        client.close()
    error = info.value
    assert isinstance(error, redis.ConnectionError)  # what callers handling an outage already catch
    assert error.url == _redacted(url) and error.ca_file == pki.other_ca
    assert error.reason.startswith("certificate verify failed: ")
    assert str(error) == (
        f"TLS verification of Redis at {_redacted(url)} failed: {error.reason}"
        f" (trusting the CA file {pki.other_ca})"
    )
    assert PASSWORD not in str(error)


def test_submit_command_with_another_ca_prints_one_line(
    url: str, pki: Pki, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ENV_REDIS_URL, url)  # restored afterwards (the CLI sets it from --redis)
    monkeypatch.setenv(ENV_REDIS_CA_FILE, pki.other_ca)
    assert cli.main(["submit", "--redis", url, "direct", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"wesichain: TLS verification of Redis at {_redacted(url)} failed: ")
    assert "certificate verify failed: " in err and err.count("\n") == 1
    assert PASSWORD not in err and "Traceback" not in err


def test_broker_connection_verifies_the_server(
    url: str, pki: Pki, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu alone would accept any certificate for a bare rediss:// URL; ours does not."""
    monkeypatch.setattr(tls, "_warned", set())  # forget warnings given earlier in this process

    def broker(settings: Settings) -> Celery:
        app = Celery("tls-test", set_as_current=False)
        app.conf.update(celery_config(settings))
        return app

    with broker(Settings(redis_url=url, redis_ca_file=pki.other_ca)).connection_for_write() as conn:
        with pytest.raises(OperationalError, match="certificate verify failed"):
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=10)
    with broker(Settings(redis_url=url, redis_ca_file=pki.ca)).connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=10)
        assert conn.default_channel.client.ping() is True

    # Turning verification off takes the switch, and says so.
    with caplog.at_level(logging.WARNING, logger="wesichain.tls"):
        insecure = Settings(redis_url=url, redis_tls_insecure=True)
        with broker(insecure).connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=10)
            assert conn.default_channel.client.ping() is True
        store = connect(insecure)
        assert store.ping() is True
        store.close()
    warnings = [r.getMessage() for r in caplog.records if r.name == "wesichain.tls"]
    assert len(warnings) == 1
    assert warnings[0].startswith(
        f"TLS certificate verification for Redis at {_redacted(url)} is OFF (WESICHAIN_REDIS_TLS_INSECURE=1)"
    )


# -- the start-up check itself ----------------------------------------------------------------------


def test_check_tls_raises_only_for_a_verification_failure(url: str, pki: Pki) -> None:
    check_tls(Settings(redis_url=url, redis_ca_file=pki.ca))
    with pytest.raises(RedisTlsError, match="certificate verify failed"):
        check_tls(Settings(redis_url=url, redis_ca_file=pki.other_ca))
    # An outage is not a mismatch: nothing listens there, and the worker's own retries apply.
    check_tls(Settings(redis_url=f"rediss://127.0.0.1:{free_port()}/0", redis_ca_file=pki.ca))


# -- mutual TLS -----------------------------------------------------------------------------------


def test_client_certificate_for_mutual_tls(pki: Pki) -> None:
    server = _server(pki, auth_clients=True)
    try:
        mtls = Settings(
            redis_url=server.url,
            redis_ca_file=pki.ca,
            redis_cert_file=pki.client_cert,
            redis_key_file=pki.client_key,
        )
        store = connect(mtls)
        assert store.ping() is True
        store.close()
        app = Celery("mtls-test", set_as_current=False)
        app.conf.update(celery_config(mtls))
        app.send_task("wesichain.start", kwargs={"run_id": "mtls"})
        raw = server.client()
        wait_until(lambda: raw.llen(MODEL_QUEUE_KEY) == 1, TIMEOUT, what="the task in the broker's queue")
        raw.close()

        without = connect(Settings(redis_url=server.url, redis_ca_file=pki.ca))
        with pytest.raises(redis.ConnectionError):
            without.ping()
        without.close()
    finally:
        server.cleanup()
