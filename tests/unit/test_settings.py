"""Settings from the environment, their validation, URL redaction, keys and the Celery config."""

from __future__ import annotations

import pytest

from shared.errors import ConfigError
from shared.keys import Keys
from shared.settings import (
    ENV_AGENTS,
    ENV_LEASE,
    ENV_MAX_ATTEMPTS,
    ENV_PREFIX,
    ENV_QUEUED_LEASE,
    ENV_REDIS_URL,
    QUEUE_MODEL,
    QUEUE_TOOLS,
    Settings,
    celery_config,
    redact_url,
)

ALL_ENV = (ENV_REDIS_URL, ENV_AGENTS, ENV_PREFIX, ENV_LEASE, ENV_QUEUED_LEASE, ENV_MAX_ATTEMPTS)


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


def test_celery_config_embedded() -> None:
    conf = celery_config(Settings(redis_url="memory://"))
    assert conf["broker_url"] == "memory://localhost/"
    assert "global_keyprefix" not in conf["broker_transport_options"]
