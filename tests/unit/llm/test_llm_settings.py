"""LlmSettings: what an operator sets for model calls, read and validated from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.errors import ConfigError
from shared.llm.base import ModelRequest
from shared.llm.settings import HttpSettings, LlmSettings


def test_defaults() -> None:
    settings = LlmSettings.from_env({})
    assert settings == LlmSettings(
        read_timeout_s=120.0, connect_timeout_s=10.0, max_attempts=3, retry_after_cap_s=30.0, scripts_dir=None
    )
    assert settings.http() == HttpSettings()
    assert ModelRequest(model="m", messages=[]).timeout_s is None  # the adapter's setting applies


def test_reads_every_variable(tmp_path: Path) -> None:
    settings = LlmSettings.from_env(
        {
            "WESICHAIN_LLM_READ_TIMEOUT_S": " 300 ",
            "WESICHAIN_LLM_CONNECT_TIMEOUT_S": "2.5",
            "WESICHAIN_LLM_MAX_ATTEMPTS": "5",
            "WESICHAIN_LLM_RETRY_AFTER_CAP_S": "0",
            "WESICHAIN_SCRIPTS_DIR": str(tmp_path),
        }
    )
    assert settings == LlmSettings(
        read_timeout_s=300.0,
        connect_timeout_s=2.5,
        max_attempts=5,
        retry_after_cap_s=0.0,
        scripts_dir=tmp_path.resolve(),
    )
    assert settings.http() == HttpSettings(
        read_timeout_s=300.0, connect_timeout_s=2.5, max_attempts=5, retry_after_cap_s=0.0
    )


def test_empty_variables_keep_the_defaults() -> None:
    names = ["READ_TIMEOUT_S", "CONNECT_TIMEOUT_S", "MAX_ATTEMPTS", "RETRY_AFTER_CAP_S"]
    environ = {f"WESICHAIN_LLM_{name}": " " for name in names} | {"WESICHAIN_SCRIPTS_DIR": ""}
    assert LlmSettings.from_env(environ) == LlmSettings()


def test_reads_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WESICHAIN_LLM_READ_TIMEOUT_S", "45")
    assert LlmSettings.from_env().read_timeout_s == 45.0


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("WESICHAIN_LLM_READ_TIMEOUT_S", "abc"),
        ("WESICHAIN_LLM_READ_TIMEOUT_S", "0"),
        ("WESICHAIN_LLM_READ_TIMEOUT_S", "-5"),
        ("WESICHAIN_LLM_READ_TIMEOUT_S", "nan"),
        ("WESICHAIN_LLM_READ_TIMEOUT_S", "inf"),
        ("WESICHAIN_LLM_CONNECT_TIMEOUT_S", "0"),
        ("WESICHAIN_LLM_CONNECT_TIMEOUT_S", "10s"),
        ("WESICHAIN_LLM_RETRY_AFTER_CAP_S", "-1"),
        ("WESICHAIN_LLM_MAX_ATTEMPTS", "0"),
        ("WESICHAIN_LLM_MAX_ATTEMPTS", "11"),
        ("WESICHAIN_LLM_MAX_ATTEMPTS", "2.5"),
        ("WESICHAIN_LLM_MAX_ATTEMPTS", "²"),
        ("WESICHAIN_SCRIPTS_DIR", "relative/dir"),
    ],
)
def test_a_bad_value_names_its_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        LlmSettings.from_env({variable: value})
    assert str(info.value).startswith(f"{variable}={value!r} is not valid: set it to ")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"read_timeout_s": 0.0},
        {"connect_timeout_s": float("nan")},
        {"retry_after_cap_s": -1.0},
        {"max_attempts": 0},
        {"max_attempts": True},
    ],
)
def test_built_directly_it_is_validated_too(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        LlmSettings(**kwargs)  # type: ignore[arg-type]


def test_http_settings_reject_a_zero_read_timeout() -> None:
    with pytest.raises(ConfigError, match="read_timeout_s"):
        HttpSettings(read_timeout_s=0)
