"""The shipped deployment (docker-compose.yml) carries what the guarantees and providers need."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def test_redis_keeps_every_acknowledged_write() -> None:
    command = compose()["services"]["redis"]["command"]
    flags = dict(zip(command[1::2], command[2::2], strict=False))
    assert flags["--appendonly"] == "yes"
    assert flags["--appendfsync"] == "always"  # what at-most-once for non-retry-safe tools needs
    assert flags["--maxmemory-policy"] == "noeviction"


def test_workers_get_the_providers_endpoints_and_a_health_probe() -> None:
    services = compose()["services"]
    for name in ("worker-model", "worker-tools"):
        env = services[name]["environment"]
        for variable in (
            "OPENAI_API_KEY",
            "OPENAI_BASE_URL",
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_BASE_URL",
            "OLLAMA_HOST",
        ):
            assert variable in env, f"{name} does not pass {variable}"
        assert services[name]["healthcheck"]["test"] == ["CMD", "wesichain", "health"]
