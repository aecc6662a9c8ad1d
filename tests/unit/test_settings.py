"""Settings from the environment, their validation, URL redaction, keys and the Celery config."""

from __future__ import annotations

import logging
import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from celery import Celery

from producer.publishing import broker_is_store
from shared import tls
from shared.errors import ConfigError
from shared.keys import Keys
from shared.redis_client import VerifiedSSLConnection, connect
from shared.settings import (
    ENV_AGENTS,
    ENV_LEASE,
    ENV_MAX_ATTEMPTS,
    ENV_PREFIX,
    ENV_QUEUED_LEASE,
    ENV_REDIS_CA_FILE,
    ENV_REDIS_CERT_FILE,
    ENV_REDIS_KEY_FILE,
    ENV_REDIS_TLS_INSECURE,
    ENV_REDIS_URL,
    QUEUE_MODEL,
    QUEUE_TOOLS,
    Settings,
    celery_config,
    redact_url,
)

ALL_ENV = (
    ENV_REDIS_URL,
    ENV_AGENTS,
    ENV_PREFIX,
    ENV_LEASE,
    ENV_QUEUED_LEASE,
    ENV_MAX_ATTEMPTS,
    ENV_REDIS_CA_FILE,
    ENV_REDIS_CERT_FILE,
    ENV_REDIS_KEY_FILE,
    ENV_REDIS_TLS_INSECURE,
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ALL_ENV:
        monkeypatch.delenv(name, raising=False)


def test_defaults() -> None:
    s = Settings.from_env()
    assert s == Settings()
    assert (s.redis_url, s.prefix, s.agents_module) == (
        "redis://127.0.0.1:6379/0",
        "wesichain:",
        "shared.examples.research",
    )
    assert not s.embedded


def test_environment_and_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_REDIS_URL, "redis://example:6380/2")
    monkeypatch.setenv(ENV_AGENTS, "my.agents")
    monkeypatch.setenv(ENV_PREFIX, "p:")
    monkeypatch.setenv(ENV_LEASE, "2.5")
    monkeypatch.setenv(ENV_QUEUED_LEASE, "7")
    monkeypatch.setenv(ENV_MAX_ATTEMPTS, "9")
    s = Settings.from_env()
    assert (s.redis_url, s.agents_module, s.prefix) == ("redis://example:6380/2", "my.agents", "p:")
    assert (s.lease_s, s.queued_lease_s, s.max_phase_attempts) == (2.5, 7.0, 9)
    # Explicit overrides win over the environment; None means "not given".
    s2 = Settings.from_env(redis_url="memory://", agents_module=None)
    assert s2.redis_url == "memory://" and s2.embedded
    assert s2.agents_module == "my.agents"
    assert s2.with_(prefix="q:").prefix == "q:"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://x", "must start with redis://, rediss:// or memory://"),
        ("localhost:6379", "must start with redis://"),
        ("", "must start with redis://"),
        ("redis://", "has no host"),
        ("redis:///0", "has no host"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(redis_url=url)


@pytest.mark.parametrize("url", ["redis://h", "rediss://user:pw@h:1/3", "memory://", "redis://[::1]:6379/0"])
def test_good_urls(url: str) -> None:
    assert Settings.from_env(redis_url=url).redis_url == url


@pytest.mark.parametrize(
    "changes", [{"lease_s": 0}, {"lease_s": -1}, {"queued_lease_s": 0}, {"max_phase_attempts": 0}]
)
def test_bad_numbers(changes: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        Settings.from_env(**changes)


def test_bad_url_error_hides_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(redis_url="http://user:hunter2@host/0")
    assert "hunter2" not in str(info.value) and "***" in str(info.value)


@pytest.mark.parametrize(
    ("url", "safe"),
    [
        ("redis://user:hunter2@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:hunter2@host/0", "redis://:***@host/0"),
        ("rediss://u:p%40ss@host/1", "rediss://u:***@host/1"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("redis://user@host/0", "redis://user@host/0"),
    ],
)
def test_redact_url(url: str, safe: str) -> None:
    assert redact_url(url) == safe


@pytest.mark.parametrize(("name", "value"), [(ENV_LEASE, "abc"), (ENV_MAX_ATTEMPTS, "1.5")])
def test_unparsable_environment_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises((ConfigError, ValueError)):
        Settings.from_env()


def test_unparsable_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_LEASE, "abc")
    with pytest.raises(ConfigError, match=ENV_LEASE):
        Settings.from_env()


# -- keys ---------------------------------------------------------------------------------------------


def test_every_key_of_a_run_shares_its_shard_s_hash_tag() -> None:
    k = Keys("pre:", shards=8)
    per_run = [
        k.run("r1"),
        k.messages("r1"),
        k.checkpoints("r1"),
        k.events("r1"),
        k.results("r1", 3),
        k.attempts("r1"),
        k.leases_of("r1"),
        k.runs_index_of("r1"),
    ]
    tag = f"pre:{{s{k.shard('r1')}}}:"
    assert all(key.startswith(tag) for key in per_run)
    assert len(set(per_run)) == len(per_run)
    assert k.results("r1", 3) != k.results("r1", 4)
    # Runs spread over every shard, each run in exactly one.
    assert {k.shard(f"run-{i}") for i in range(200)} == set(range(8))
    assert Keys("a:").run("x") != Keys("b:").run("x")


def test_shards_are_bounded() -> None:
    with pytest.raises(ConfigError, match="shards"):
        Settings(shards=0).validate()


# -- celery configuration -----------------------------------------------------------------------------


def test_celery_config_distributed() -> None:
    s = Settings(redis_url="redis://h:1/0", prefix="pfx:")
    conf = celery_config(s)
    assert conf["broker_url"] == "redis://h:1/0"
    # No key prefix on the broker: a plain Celery app with the broker URL reaches the queues.
    assert "global_keyprefix" not in conf["broker_transport_options"]
    assert "retry_on_timeout" not in conf["broker_transport_options"]
    assert conf["worker_cancel_long_running_tasks_on_connection_loss"] is False
    prefixed = celery_config(Settings(redis_url="redis://h:1/0", broker_prefix="svc:"))
    assert prefixed["broker_transport_options"]["global_keyprefix"] == "svc:"
    assert conf["broker_transport_options"]["visibility_timeout"] == s.visibility_timeout_s
    assert (conf["task_acks_late"], conf["worker_prefetch_multiplier"]) == (True, 1)
    assert conf["task_reject_on_worker_lost"] is True
    assert conf["accept_content"] == ["json"] and conf["task_serializer"] == "json"
    assert conf["result_backend"] is None
    assert conf["task_routes"]["wesichain.tool"] == {"queue": QUEUE_TOOLS}
    assert conf["task_routes"]["wesichain.*"] == {"queue": QUEUE_MODEL}
    # Retries on worker loss come back well inside the visibility timeout.
    delay = conf["task_annotations"]["*"]["default_retry_delay"]
    assert delay < s.visibility_timeout_s


def test_celery_config_rabbitmq() -> None:
    s = Settings(redis_url="redis://h:1/0", broker_url="amqp://u:p@rabbit:5672/v")
    s.validate()
    conf = celery_config(s)
    assert conf["broker_url"] == "amqp://u:p@rabbit:5672/v"
    assert conf["broker_transport_options"] == {"confirm_publish": True, "connect_timeout": 5}
    assert conf["task_default_queue_type"] == conf["task_create_missing_queue_type"] == "quorum"
    assert conf["task_default_exchange_type"] == conf["task_create_missing_queue_exchange_type"] == "topic"
    assert (conf["task_acks_late"], conf["worker_prefetch_multiplier"]) == (True, 1)
    assert celery_config(s.with_(broker_url="amqps://rabbit/v"))["broker_use_ssl"] is True
    # Redis keeps its own defaults.
    assert "task_default_queue_type" not in celery_config(Settings(redis_url="redis://h:1/0"))
    assert "password" not in repr(Settings(broker_url="amqp://u:password@rabbit/v"))


@pytest.mark.parametrize(
    ("redis_url", "broker_url", "error"),
    [
        ("redis://h:1/0", "kafka://other:9092", "must be an amqp://, amqps://, redis:// or rediss:// URL"),
        ("redis://h:1/0", "amqp:///v", "must be an amqp://, amqps://, redis:// or rediss:// URL with a host"),
        ("memory://", "amqp://rabbit/v", "cannot be used in the embedded mode"),
    ],
)
def test_a_broker_url_must_be_rabbitmq_or_redis(redis_url: str, broker_url: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        Settings(redis_url=redis_url, broker_url=broker_url).validate()


def test_a_standalone_redis_broker_gets_the_redis_transport_and_no_commit_publish() -> None:
    s = Settings(redis_url="redis://store:1/0", broker_url="redis://:pw@broker:6379/3")
    s.validate()
    conf = celery_config(s)
    assert conf["broker_url"] == "redis://:pw@broker:6379/3"
    assert conf["broker_transport_options"]["visibility_timeout"] == s.visibility_timeout_s
    assert "task_default_queue_type" not in conf
    assert s.broker_is_redis and s.broker_endpoint().redis_url == "redis://:pw@broker:6379/3"
    assert not broker_is_store(s)  # the commit script cannot push to another server's lists


def test_a_cluster_store_needs_a_broker_url_of_its_own() -> None:
    with pytest.raises(ConfigError, match="WESICHAIN_REDIS_CLUSTER=1 needs WESICHAIN_BROKER_URL"):
        Settings(redis_url="redis://node:7000/0", redis_cluster=True).validate()
    with pytest.raises(ConfigError, match="only database 0"):
        Settings(redis_url="redis://node:7000/2", redis_cluster=True, broker_url="amqp://r/v").validate()
    with pytest.raises(ConfigError, match="embedded"):
        Settings(redis_url="memory://", redis_cluster=True).validate()
    for broker in ("amqp://rabbit/v", "redis://broker:6379/0"):
        settings = Settings(redis_url="redis://node:7000", redis_cluster=True, broker_url=broker)
        settings.validate()
        assert not broker_is_store(settings)


def test_the_cluster_switch_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WESICHAIN_REDIS_CLUSTER", "1")
    monkeypatch.setenv("WESICHAIN_BROKER_URL", "redis://broker:6379/0")
    s = Settings.from_env(redis_url="redis://node:7000/0")
    assert (s.redis_cluster, s.broker_url) == (True, "redis://broker:6379/0")
    monkeypatch.delenv("WESICHAIN_BROKER_URL")
    with pytest.raises(ConfigError, match="Celery's Redis transport cannot use a Redis Cluster"):
        Settings.from_env(redis_url="redis://node:7000/0")


def test_the_broker_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WESICHAIN_BROKER_URL", "amqp://rabbit/v")
    monkeypatch.setenv("WESICHAIN_COMMIT_PUBLISH", "0")
    s = Settings.from_env(redis_url="redis://h:1/0")
    assert (s.broker_url, s.commit_publish) == ("amqp://rabbit/v", False)


def test_celery_config_embedded() -> None:
    conf = celery_config(Settings(redis_url="memory://"))
    assert conf["broker_url"] == "memory://localhost/"
    assert "global_keyprefix" not in conf["broker_transport_options"]


def test_celery_config_without_tls_leaves_ssl_off() -> None:
    assert celery_config(Settings(redis_url="redis://h:1/0"))["broker_use_ssl"] is False
    assert celery_config(Settings(redis_url="memory://"))["broker_use_ssl"] is False


# -- TLS ------------------------------------------------------------------------------------------

VERIFY_WITH_SYSTEM_CAS = {
    "ssl_cert_reqs": ssl.CERT_REQUIRED,
    "ssl_check_hostname": True,
    "ssl_ca_certs": None,
    "ssl_certfile": None,
    "ssl_keyfile": None,
}


@dataclass(frozen=True)
class Pem:
    cert: str  # self-signed: serves as a CA file and as a client certificate
    key: str
    other_key: str  # does not match ``cert``
    encrypted_key: str
    not_pem: str


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> Pem:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("pem")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"), "-subj", "/CN=t")
    openssl("req", "-x509", *ec, "-keyout", str(d / "other.pem"), "-out", str(d / "o.pem"), "-subj", "/CN=o")
    openssl("pkey", "-in", str(d / "key.pem"), "-aes256", "-passout", "pass:pw", "-out", str(d / "enc.pem"))
    (d / "notes.txt").write_text("not a certificate\n")
    return Pem(*(str(d / n) for n in ("cert.pem", "key.pem", "other.pem", "enc.pem", "notes.txt")))


def _broker_ssl(settings: Settings) -> Any:
    """The TLS options of the broker connection Celery builds from our config (no network)."""
    app = Celery("tls-unit", set_as_current=False)
    app.conf.update(celery_config(settings))
    with app.connection_for_write() as conn:
        return conn.ssl


def test_rediss_verifies_the_broker_and_the_store_by_default() -> None:
    s = Settings.from_env(redis_url="rediss://:pw@redis.example:6380/0")
    conf = celery_config(s)
    assert conf["broker_url"] == "rediss://:pw@redis.example:6380/0"
    assert conf["broker_use_ssl"] == VERIFY_WITH_SYSTEM_CAS
    # Given no options, kombu would connect a bare rediss:// broker URL with CERT_NONE.
    assert _broker_ssl(s) == VERIFY_WITH_SYSTEM_CAS
    store = connect(s).connection_pool
    assert store.connection_class is VerifiedSSLConnection
    assert {k: store.connection_kwargs[k] for k in VERIFY_WITH_SYSTEM_CAS} == VERIFY_WITH_SYSTEM_CAS
    assert store.connection_kwargs["display_url"] == "rediss://:***@redis.example:6380/0"


def test_tls_files_from_the_environment(monkeypatch: pytest.MonkeyPatch, pem: Pem) -> None:
    monkeypatch.setenv(ENV_REDIS_URL, "rediss://redis.example/0")
    monkeypatch.setenv(ENV_REDIS_CA_FILE, pem.cert)
    monkeypatch.setenv(ENV_REDIS_CERT_FILE, pem.cert)
    monkeypatch.setenv(ENV_REDIS_KEY_FILE, pem.key)
    s = Settings.from_env()
    assert (s.redis_ca_file, s.redis_cert_file, s.redis_key_file, s.redis_tls_insecure) == (
        pem.cert,
        pem.cert,
        pem.key,
        False,
    )
    expected = {
        **VERIFY_WITH_SYSTEM_CAS,
        "ssl_ca_certs": pem.cert,
        "ssl_certfile": pem.cert,
        "ssl_keyfile": pem.key,
    }
    assert celery_config(s)["broker_use_ssl"] == expected
    assert _broker_ssl(s) == expected
    kwargs = connect(s).connection_pool.connection_kwargs
    assert {k: kwargs[k] for k in expected} == expected


def test_url_tls_parameters_are_moved_out_of_the_url(pem: Pem) -> None:
    """kombu and redis-py would let the URL's ssl_* parameters override broker_use_ssl."""
    url = f"rediss://:pw@redis.example/2?ssl_ca_certs={quote(pem.cert)}&ssl_cert_reqs=required"
    s = Settings.from_env(redis_url=url)
    conf = celery_config(s)
    assert conf["broker_url"] == "rediss://:pw@redis.example/2"
    assert conf["broker_use_ssl"] == {**VERIFY_WITH_SYSTEM_CAS, "ssl_ca_certs": pem.cert}
    assert _broker_ssl(s) == conf["broker_use_ssl"]
    kwargs = connect(s).connection_pool.connection_kwargs
    assert (kwargs["ssl_cert_reqs"], kwargs["ssl_ca_certs"], kwargs["db"]) == (ssl.CERT_REQUIRED, pem.cert, 2)


def test_the_insecure_switch_is_the_only_way_to_cert_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url = "rediss://:hunter2@insecure.example/0"
    for weakening in ("ssl_cert_reqs=none", "ssl_cert_reqs=CERT_OPTIONAL", "ssl_check_hostname=false"):
        with pytest.raises(ConfigError, match=f"unless {ENV_REDIS_TLS_INSECURE}=1"):
            Settings.from_env(redis_url=f"{url}?{weakening}")
    assert celery_config(Settings(redis_url=url))["broker_use_ssl"]["ssl_cert_reqs"] == ssl.CERT_REQUIRED

    monkeypatch.setenv(ENV_REDIS_TLS_INSECURE, "1")
    monkeypatch.setattr(tls, "_warned", set())  # forget warnings given earlier in this process
    with caplog.at_level(logging.WARNING, logger="wesichain.tls"):
        s = Settings.from_env(redis_url=url)
        conf = celery_config(s)
        connect(s)
    assert s.redis_tls_insecure
    insecure = {**VERIFY_WITH_SYSTEM_CAS, "ssl_cert_reqs": ssl.CERT_NONE, "ssl_check_hostname": False}
    assert conf["broker_use_ssl"] == insecure
    assert _broker_ssl(s) == insecure
    warnings = [r for r in caplog.records if r.name == "wesichain.tls"]
    assert [r.levelno for r in warnings] == [logging.WARNING]  # once per process, not per connection
    assert (
        warnings[0]
        .getMessage()
        .startswith(
            "TLS certificate verification for Redis at rediss://:***@insecure.example/0 is OFF"
            f" ({ENV_REDIS_TLS_INSECURE}=1)"
        )
    )
    assert Settings.from_env(redis_url=f"{url}?ssl_cert_reqs=none").redis_tls_insecure
    with pytest.raises(ConfigError, match="contradicts"):
        Settings.from_env(redis_url=f"{url}?ssl_cert_reqs=required")

    monkeypatch.setenv(ENV_REDIS_TLS_INSECURE, "0")
    assert not Settings.from_env(redis_url=url).redis_tls_insecure
    monkeypatch.setenv(ENV_REDIS_TLS_INSECURE, "maybe")
    with pytest.raises(ConfigError, match=f"{ENV_REDIS_TLS_INSECURE}='maybe'"):
        Settings.from_env(redis_url=url)


@pytest.mark.parametrize(
    ("env", "field_name"),
    [
        (ENV_REDIS_CA_FILE, "redis_ca_file"),
        (ENV_REDIS_CERT_FILE, "redis_cert_file"),
        (ENV_REDIS_KEY_FILE, "redis_key_file"),
    ],
)
def test_a_missing_tls_file_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pem: Pem, env: str, field_name: str
) -> None:
    monkeypatch.setenv(ENV_REDIS_CERT_FILE, pem.cert)
    monkeypatch.setenv(ENV_REDIS_KEY_FILE, pem.key)
    missing = str(tmp_path / "nope.pem")
    monkeypatch.setenv(env, missing)
    with pytest.raises(ConfigError) as info:
        Settings.from_env(redis_url="rediss://:hunter2@h/0")
    assert str(info.value) == f"{env}: {missing!r} does not exist or is not a file"
    # The same check holds for settings built without from_env, when they are used.
    s = Settings(redis_url="rediss://h/0").with_(**{field_name: missing})
    with pytest.raises(ConfigError, match=env):
        celery_config(s)
    with pytest.raises(ConfigError, match=env):
        connect(s)


def test_tls_files_that_do_not_load(monkeypatch: pytest.MonkeyPatch, pem: Pem) -> None:
    url = "rediss://h/0"
    with pytest.raises(ConfigError, match=f"{ENV_REDIS_CA_FILE}: .* holds no PEM CA certificate"):
        Settings.from_env(redis_url=url, redis_ca_file=pem.not_pem)
    with pytest.raises(ConfigError, match=f"ssl_ca_certs in the Redis URL: '{pem.not_pem}' holds no PEM"):
        Settings.from_env(redis_url=f"{url}?ssl_ca_certs={quote(pem.not_pem)}")
    with pytest.raises(ConfigError, match=f"{ENV_REDIS_KEY_FILE} is set without a client certificate"):
        Settings.from_env(redis_url=url, redis_key_file=pem.key)
    with pytest.raises(ConfigError, match="not a PEM client certificate and its private key"):
        Settings.from_env(redis_url=url, redis_cert_file=pem.cert, redis_key_file=pem.other_key)
    with pytest.raises(ConfigError, match=f"{ENV_REDIS_KEY_FILE}: the private key is encrypted"):
        Settings.from_env(redis_url=url, redis_cert_file=pem.cert, redis_key_file=pem.encrypted_key)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://:hunter2@h/0?ssl_ca_certs=/x", r"TLS parameters \(ssl_ca_certs\) in a redis:// URL"),
        ("rediss://:hunter2@h/0?ssl_ciphers=ALL", "unsupported TLS parameter ssl_ciphers"),
        ("rediss://:hunter2@h/0?ssl_cert_reqs=sometimes", "ssl_cert_reqs='sometimes'"),
        ("rediss://:hunter2@h/0?ssl_check_hostname=maybe", "ssl_check_hostname='maybe'"),
    ],
)
def test_bad_tls_parameters_in_the_url(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        Settings.from_env(redis_url=url)
    assert "hunter2" not in str(info.value)


def test_tls_files_need_a_rediss_url(monkeypatch: pytest.MonkeyPatch, pem: Pem) -> None:
    monkeypatch.setenv(ENV_REDIS_CA_FILE, pem.cert)
    with pytest.raises(ConfigError) as info:
        Settings.from_env(redis_url="redis://:hunter2@h/0")
    assert str(info.value) == (
        f"{ENV_REDIS_CA_FILE} is set but the Redis URL redis://:***@h/0 is redis://, which does not use TLS:"
        " use rediss://"
    )
    assert Settings.from_env(redis_url="memory://").embedded  # the embedded mode has no Redis to verify


def test_a_file_given_twice_must_agree(pem: Pem) -> None:
    url = f"rediss://h/0?ssl_ca_certs={quote(pem.cert)}"
    assert Settings.from_env(redis_url=url, redis_ca_file=pem.cert).redis_ca_file == pem.cert
    with pytest.raises(ConfigError, match=f"{ENV_REDIS_CA_FILE}=.* and ssl_ca_certs=.* disagree"):
        Settings.from_env(redis_url=url, redis_ca_file=pem.key)
