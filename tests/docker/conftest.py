"""The Docker smoke suite's setup, on pytest-celery: a Redis broker container and a worker
container running ``wesichain worker`` from the image the project's Dockerfile builds.

It runs when a Docker engine answers, and every test here is skipped, saying why, when none
does. The engine check happens once, only when tests of this directory were collected.
"""

from __future__ import annotations

import io
import os
import re
import socket
import tarfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pytest_celery import (
    CeleryBrokerCluster,
    CeleryTestWorker,
    CeleryWorkerCluster,
    CeleryWorkerContainer,
    RedisTestBroker,
)
from pytest_docker_tools import container, fxtr

from shared.settings import QUEUE_MODEL

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
#: How long the engine may take to answer a ping before the suite is skipped.
PING_TIMEOUT_S = 3
IMAGE_TAG = "wesichain/worker:smoke"
#: The agents the worker container runs: the demo needs no API key.
AGENTS = "shared.examples.research"


@cache
def docker_unavailable() -> str | None:
    """Why the suite cannot run here (no engine answers a ping), or None when one does."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        status = _ping(host)
    except Exception as exc:  # OSError, DockerException, the HTTP transport's connection errors
        detail = str(exc).splitlines()[0] if str(exc) else ""
        return f"no Docker engine answers at {host} ({type(exc).__name__}: {detail})"
    if status != 200:
        return f"the Docker engine at {host} answered its ping with HTTP {status}"
    return None


def _ping(host: str) -> int:
    """The HTTP status of the engine's unversioned ``/_ping``, within PING_TIMEOUT_S."""
    if host.startswith("unix://"):
        # By hand: docker-py leaks its socket when nothing listens on the path.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(PING_TIMEOUT_S)
            sock.connect(host.removeprefix("unix://"))
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            status_line = sock.recv(256).split(b"\r\n", 1)[0].split()
        return int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else 0
    from docker import APIClient
    from docker.constants import MINIMUM_DOCKER_API_VERSION
    from docker.utils import kwargs_from_env

    # A fixed API version spares the client its own version query before the ping.
    client = APIClient(version=MINIMUM_DOCKER_API_VERSION, timeout=PING_TIMEOUT_S, **kwargs_from_env())
    try:
        return int(client.get(f"{client.base_url}/_ping", timeout=PING_TIMEOUT_S).status_code)
    finally:
        client.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    smoke = [item for item in items if HERE in item.path.parents]
    if smoke and (reason := docker_unavailable()) is not None:
        marker = pytest.mark.skip(reason=f"Docker smoke suite skipped: {reason}")
        for item in smoke:
            item.add_marker(marker)


def build_context() -> io.BytesIO:
    """The Dockerfile and what its COPY lines name: the build never uploads .venv or .git."""
    dockerfile = ROOT / "Dockerfile"
    sources = {"Dockerfile"}
    for line in dockerfile.read_text().splitlines():
        if re.match(r"\s*COPY\s", line) and "--from" not in line:
            sources.update(line.split()[1:-1])
    buffer = io.BytesIO()

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        name = Path(info.name)
        if "__pycache__" in name.parts or name.suffix == ".pyc" or name.name.endswith(".egg-info"):
            return None
        return info

    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for source in sorted(sources):
            tar.add(ROOT / source, arcname=source, filter=keep)
    buffer.seek(0)
    return buffer


class WesichainWorkerContainer(CeleryWorkerContainer):
    """``wesichain worker`` (the image's entry point) with the threads pool, both queues."""

    @classmethod
    def command(
        cls, *args: str, debugpy: bool = False, wait_for_client: bool = True, **kwargs: Any
    ) -> list[str]:
        return [
            "worker",
            "--pool",
            "threads",
            "--concurrency",
            "4",
            "--name",
            f"{cls.worker_name()}@%h",
            *args,
        ]

    @classmethod
    def worker_name(cls) -> str:
        return "smoke"

    @classmethod
    def worker_queue(cls) -> str:
        return QUEUE_MODEL


@pytest.fixture(scope="session")
def smoke_worker_image(docker_client: Any) -> Any:
    """The image the project's Dockerfile builds, built once per session."""
    image, _ = docker_client.images.build(
        fileobj=build_context(), custom_context=True, encoding="gzip", tag=IMAGE_TAG, rm=True
    )
    return image


@pytest.fixture
def smoke_worker_env(celery_redis_broker: RedisTestBroker) -> dict[str, str]:
    """The worker's settings: the broker container's address on the test network."""
    return {
        "WESICHAIN_REDIS_URL": celery_redis_broker.config()["url"],
        "WESICHAIN_AGENTS": AGENTS,
        "PYTHONUNBUFFERED": "1",
    }


smoke_worker_container = container(
    image="{smoke_worker_image.id}",
    environment=fxtr("smoke_worker_env"),
    network="{default_pytest_celery_network.name}",
    wrapper_class=WesichainWorkerContainer,
    timeout=120,
    command=WesichainWorkerContainer.command(),
)


@pytest.fixture
def smoke_worker(
    smoke_worker_container: WesichainWorkerContainer, celery_setup_app: Any
) -> Iterator[CeleryTestWorker]:
    worker = CeleryTestWorker(smoke_worker_container, app=celery_setup_app)
    yield worker
    worker.teardown()


# pytest-celery's setup, narrowed to what the product runs on: one Redis broker, no result
# backend (run state lives in the project's own keys), and the project's worker.


@pytest.fixture
def celery_broker_cluster(celery_redis_broker: RedisTestBroker) -> Iterator[CeleryBrokerCluster]:
    cluster = CeleryBrokerCluster(celery_redis_broker)
    yield cluster
    cluster.teardown()


@pytest.fixture
def celery_backend_cluster() -> None:
    return None


@pytest.fixture
def celery_worker_cluster(smoke_worker: CeleryTestWorker) -> Iterator[CeleryWorkerCluster]:
    cluster = CeleryWorkerCluster(smoke_worker)
    yield cluster
    cluster.teardown()
