"""The shipped deployment (docker-compose.yml) carries what the guarantees and providers need."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from tests.compose_profiles import documented_profiles
from worker.metrics import metrics

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


ROOT = COMPOSE.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "wesichain.json"


def test_every_service_has_a_healthcheck() -> None:
    services = compose()["services"]
    assert {"redis", "worker-model", "worker-tools", "api", "sweeper", "metrics", "flower"} <= set(services)
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    assert "/healthz" in " ".join(services["api"]["healthcheck"]["test"])


def test_every_queue_is_consumed_and_workers_serve_metrics() -> None:
    services = compose()["services"]
    queues = set()
    for name in ("worker-model", "worker-tools"):
        command = services[name]["command"]
        queues |= set(command[command.index("--queues") + 1].split(","))
        assert services[name]["environment"]["WESICHAIN_METRICS_PORT"] == "9808"
        assert services[name]["environment"]["REMAP_SIGTERM"] == "SIGQUIT"
    assert queues == {"wesichain.model", "wesichain.tools", "wesichain.callbacks"}
    assert services["metrics"]["command"] == ["metrics", "--port", "9808"]


def test_prometheus_and_grafana_come_with_the_monitoring_profile() -> None:
    services = compose()["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"]
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())["scrape_configs"]
    workers = next(job for job in scrape if job["job_name"] == "wesichain-workers")["dns_sd_configs"][0]
    assert set(workers["names"]) == {"worker-model", "worker-tools"} and workers["port"] == 9808
    pool = next(job for job in scrape if job["job_name"] == "wesichain-pool")
    assert pool["static_configs"][0]["targets"] == ["metrics:9808"]


def test_the_compose_file_follows_the_compose_specification() -> None:
    checker = shutil.which("check-jsonschema") or str(Path(sys.executable).parent / "check-jsonschema")
    result = subprocess.run(
        [checker, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _exported() -> set[str]:
    """Every sample name the workers and the pool exporter can serve."""
    names: set[str] = set()
    for attribute in vars(metrics()).values():
        if isinstance(attribute, MetricWrapperBase):
            for family in attribute.describe():
                base = family.name
                if family.type == "counter":
                    names.add(base + "_total")
                elif family.type == "histogram":
                    names |= {base + "_bucket", base + "_count", base + "_sum"}
                else:
                    names.add(base)
    source = (ROOT / "worker" / "exporter.py").read_text()
    names |= set(re.findall(r'"(wesichain_[a-z_]+)"', source))
    return names


def test_the_dashboard_only_plots_metrics_that_exist() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    used = {name for expr in expressions for name in re.findall(r"\bwesichain_[a-z_]+", expr)}
    assert len(used) >= 20
    assert used <= _exported(), used - _exported()
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_the_archive_profile_runs_postgres_and_an_archiver() -> None:
    data = compose()
    services = data["services"]
    assert services["postgres"]["profiles"] == services["archiver"]["profiles"] == ["archive"]
    assert services["archiver"]["command"] == ["archive", "--loop"]
    assert services["archiver"]["depends_on"]["postgres"] == {"condition": "service_healthy"}
    # Every service reads archived runs once the URL is set, not only the archiver.
    for name in ("worker-model", "worker-tools", "api", "archiver"):
        assert "WESICHAIN_ARCHIVE_URL" in services[name]["environment"], name
    assert "postgres-data" in data["volumes"]
    assert _image_extras() >= {"postgres"}  # the archive's driver is in the image


def _image_extras() -> set[str]:
    """The extras of the project the image installs (``pip install ".[a,b]"`` in the Dockerfile)."""
    found = re.findall(
        r'pip install --no-cache-dir "\.\[([a-z0-9_,-]+)\]"', (ROOT / "Dockerfile").read_text()
    )
    assert len(found) == 1, found
    return set(found[0].split(","))


def test_the_image_carries_the_extras_its_features_import() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert _image_extras() == {"postgres", "mcp", "otel"}
    assert _image_extras() <= set(extras)


def test_every_service_is_restarted_when_its_process_exits() -> None:
    services = compose()["services"]
    policies = {name: service.get("restart") for name, service in services.items()}
    assert policies == dict.fromkeys(services, "unless-stopped")


#: A tag naming one release, never a line of them ("7", "16", "latest", none): at least two numbers
#: (PostgreSQL's releases have two since 10), an optional leading v and variant (-slim-bookworm).
RELEASE_TAG = re.compile(r"^[a-z0-9./_-]+:v?\d+\.\d+(\.\d+)?(-[a-z0-9.-]+)?$")


def test_every_image_is_pinned_to_a_release() -> None:
    images = {name: s["image"] for name, s in compose()["services"].items() if "image" in s}
    assert images == {
        "redis": "redis:7.2.7",
        "postgres": "postgres:16.4",
        "prometheus": "prom/prometheus:v2.54.1",
        "grafana": "grafana/grafana:11.2.0",
    }
    bases = re.findall(r"^FROM\s+(\S+)", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert bases == ["python:3.11.10-slim-bookworm"]
    for image in [*images.values(), *bases]:
        assert RELEASE_TAG.match(image), image


# Compose's interpolation (the compose specification's rules): $$ is a literal $, ${VAR:?err}
# fails when VAR is unset or empty, ${VAR?err} when it is unset; the file uses no nested forms.
_REFERENCE = re.compile(
    r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)"
)


def _required(value: Any) -> set[str]:
    """Every variable a value of the file requires (``${VAR:?...}`` or ``${VAR?...}``)."""
    if isinstance(value, dict):
        return {name for item in [*value.keys(), *value.values()] for name in _required(item)}
    if isinstance(value, list):
        return {name for item in value for name in _required(item)}
    if isinstance(value, str):
        return {m[1] for m in _REFERENCE.finditer(value) if m[2] in (":?", "?")}
    return set()


def _missing(value: Any, env: dict[str, str]) -> set[str]:
    """The required variables Compose would report missing when interpolating ``value`` in ``env``."""
    missing = set()
    for name in _required(value):
        if name not in env or (env[name] == "" and f"${{{name}:?" in _text(value)):
            missing.add(name)
    return missing


def _text(value: Any) -> str:
    return json.dumps(value)


def _referenced(value: Any) -> set[str]:
    return {m[1] or m[4] for m in _REFERENCE.finditer(_text(value)) if m[0] != "$$"}


def test_required_variables_are_exactly_what_the_docs_list_for_each_profile() -> None:
    data = compose()
    profiles = documented_profiles()
    assert profiles == {
        "": {"FLOWER_BASIC_AUTH"},
        "monitoring": {"FLOWER_BASIC_AUTH", "GRAFANA_ADMIN_PASSWORD"},
        "archive": {"FLOWER_BASIC_AUTH", "POSTGRES_PASSWORD", "WESICHAIN_ARCHIVE_URL"},
    }
    # Compose interpolates the services of every profile, active or not (and the x- blocks): a
    # variable the file requires is required by every profile, so it belongs to the services run
    # without a profile and to the docs' row for them.
    assert _required(data) == profiles[""]
    for profile, variables in profiles.items():
        assert _missing(data, dict.fromkeys(variables, "set")) == set(), profile
        assert variables >= profiles[""], profile
    services = data["services"]
    for name, service in services.items():
        if service.get("profiles"):
            assert _required(service) == set(), f"{name} requires a variable every profile would need"
    # A profile's own variables reach one of its services, which checks them when it starts.
    for profile, variables in profiles.items():
        own = [s for s in services.values() if s.get("profiles") == [profile]] if profile else []
        for variable in variables - profiles[""]:
            assert any(variable in _referenced(s) for s in own), (profile, variable)


def test_the_compose_check_runs_once_per_documented_profile() -> None:
    assert documented_profiles(
        "x\n<!-- compose-profiles -->\n| Profile | Start | Variables | Adds |\n|---|---|---|---|\n"
        "| (none) | `up` | `A_B` (`user:password`) | x |\n| `p` | `up` | `A_B`, `C` | `D_E` |\n\nafter `F`\n"
    ) == {"": {"A_B"}, "p": {"A_B", "C"}}


@pytest.mark.parametrize(
    ("service", "variable", "message"),
    [
        (
            "grafana",
            "GRAFANA_ADMIN_PASSWORD",
            "grafana: set GRAFANA_ADMIN_PASSWORD (the monitoring profile needs it)",
        ),
        ("postgres", "POSTGRES_PASSWORD", "postgres: set POSTGRES_PASSWORD (the archive profile needs it)"),
    ],
)
def test_a_profile_service_without_its_password_says_so_and_exits(
    service: str, variable: str, message: str
) -> None:
    spec = compose()["services"][service]
    shell, flag, script = spec["entrypoint"]
    assert (shell, flag) == ("/bin/sh", "-c")
    script = script.replace("$$", "$")  # what Compose hands the container

    def start(value: str) -> subprocess.CompletedProcess[str]:
        environment = {
            key: _REFERENCE.sub(lambda m: value if (m[1] or m[4]) == variable else "", str(raw))
            for key, raw in spec["environment"].items()
        }
        return subprocess.run(
            ["sh", "-c", script], env={"PATH": "/usr/bin:/bin", **environment}, capture_output=True, text=True
        )

    refused = start("")
    assert (refused.returncode, refused.stderr) == (1, message + "\n")
    # With it, the guard hands over to the image's own entrypoint (absent here: 127, not found).
    allowed = start("s3cret")
    assert allowed.returncode == 127 and message not in allowed.stderr
