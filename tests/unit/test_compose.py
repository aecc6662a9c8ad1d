"""The shipped deployment (docker-compose.yml) carries what the guarantees and providers need."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.metrics import MetricWrapperBase

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
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'pip install --no-cache-dir ".[postgres]"' in dockerfile  # the archive's driver is in the image
