"""Reading a Prometheus endpoint as a real scraper does: HTTP GET, then the text exposition format."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

#: A sample: its name and its labels, sorted.
SampleKey = tuple[str, tuple[tuple[str, str], ...]]


def scrape(port: int) -> dict[SampleKey, float]:
    """Every sample served on ``http://127.0.0.1:port/metrics``."""
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    response.raise_for_status()
    samples: dict[SampleKey, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def total(ports: Iterable[int]) -> dict[SampleKey, float]:
    """The samples of several endpoints added up (one pool of workers)."""
    summed: dict[SampleKey, float] = {}
    for port in ports:
        for key, value in scrape(port).items():
            summed[key] = summed.get(key, 0.0) + value
    return summed


def value(samples: Mapping[SampleKey, float], name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0 if none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))
