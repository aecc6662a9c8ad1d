"""OpenTelemetry spans of real phase tasks (the embedded worker), read with the SDK's in-memory
exporter: one span per phase, model call and tool call, all in the trace the run id names."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared.settings import ENV_AGENTS, ENV_OTEL, ENV_PREFIX, ENV_REDIS_URL
from shared.state import Phase
from worker.embedded import embedded
from worker.tracing import Tracing, span_id_of, trace_id_of

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    for name in (ENV_REDIS_URL, ENV_AGENTS, ENV_PREFIX, ENV_OTEL):
        monkeypatch.delenv(name, raising=False)
    # A process sets its tracer provider once: the first test that needs one sets it for all.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def _attrs(span: ReadableSpan) -> Mapping[str, Any]:
    return span.attributes or {}


def test_a_run_is_one_trace_of_phase_model_and_tool_spans(spans: InMemorySpanExporter) -> None:
    with embedded("tests.agents_fixture", otel=True) as client:
        handle = client.submit("one_hop", "what is 1 + 2?")
        assert handle.wait(timeout=30).phase is Phase.COMPLETED
        other = client.submit("direct", "and you?")
        assert other.wait(timeout=30).phase is Phase.COMPLETED
    mine = [s for s in spans.get_finished_spans() if _attrs(s).get("wesichain.run_id") == handle.run_id]
    names = sorted(s.name for s in mine)
    assert names == sorted(
        [
            "wesichain.idle",
            "wesichain.thinking",
            "wesichain.model_call",
            "wesichain.acting",
            "wesichain.tool",
            "wesichain.observing",
            "wesichain.thinking",
            "wesichain.model_call",
        ]
    )
    assert {s.context.trace_id for s in mine} == {int(handle.run_id, 16)}
    by_id = {s.context.span_id: s for s in mine}
    for s in mine:
        assert s.parent is not None
        if s.name == "wesichain.model_call":
            assert by_id[s.parent.span_id].name == "wesichain.thinking"
            assert _attrs(s)["gen_ai.system"] == "scripted"
            assert _attrs(s)["gen_ai.usage.input_tokens"] == 10
        elif s.name == "wesichain.tool":
            assert by_id[s.parent.span_id].name == "wesichain.acting"
            assert _attrs(s)["wesichain.tool"] == "add"
        else:  # every phase hangs under the run's own (unrecorded) root
            assert s.parent.span_id == span_id_of(handle.run_id)
    theirs = [s for s in spans.get_finished_spans() if _attrs(s).get("wesichain.run_id") == other.run_id]
    assert {s.context.trace_id for s in theirs} == {int(other.run_id, 16)}


def test_run_ids_that_are_not_hex_get_a_stable_trace_id() -> None:
    assert trace_id_of("order-4711") == trace_id_of("order-4711") != trace_id_of("order-4712")
    assert 0 < trace_id_of("order-4711") < 2**128
    assert trace_id_of("0" * 32) != 0  # an all-zero id is not a valid trace id


def test_tracing_is_off_unless_asked() -> None:
    off = Tracing()
    assert not off.enabled
    with off.span("wesichain.thinking", "r1") as span:
        assert span is None


@pytest.mark.parametrize("otel", [False, True])
def test_the_api_traces_its_requests_only_with_the_product_s_switch_on(
    spans: InMemorySpanExporter, otel: bool
) -> None:
    """FastAPI's own request spans follow ``WESICHAIN_OTEL``: off, the API asks OpenTelemetry
    nothing per request (it read the environment on each), even with a tracer provider set up."""
    import asyncio
    import inspect

    import httpx
    from fastapi import FastAPI

    from producer.api.app import create_app
    from producer.api.config import ApiConfig
    from shared.settings import Settings

    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        pytest.skip("this FastAPI has no instrumentation of its own")
    app = create_app(ApiConfig(settings=Settings(otel=otel)))

    async def ask() -> int:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            return (await http.get("/v1/no-such-path")).status_code

    assert asyncio.run(ask()) == 404
    requests = [s for s in spans.get_finished_spans() if "no-such-path" in str(_attrs(s).values())]
    assert bool(requests) is otel
