"""OpenTelemetry spans of a worker: one per phase, per model call and per tool call.

Off unless ``WESICHAIN_OTEL=1`` (``Settings.otel``), and the dependency is optional (the ``otel``
extra). Every span of a run belongs to one trace whose id is derived from the run id (the id
itself when it is 32 hex digits, as the client's are; else the first 128 bits of its SHA-256), so
one run across many workers and retries is one trace, with no context carried in task messages.
The spans of a run hang under a parent span id derived the same way, which no process records: a
run has no single process that could own its root span.

When the process has no tracer provider of its own, one is set up with the OTLP exporter
(``OTEL_EXPORTER_OTLP_ENDPOINT`` and the SDK's other variables), if installed, else the console.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from shared.errors import ConfigError

__all__ = ["Tracing", "span_id_of", "trace_id_of"]

log = logging.getLogger("wesichain.tracing")

_HEX32 = re.compile(r"[0-9a-f]{32}")


def trace_id_of(run_id: str) -> int:
    """The trace id of a run: the run id as a number when it is 32 hex digits, else hashed."""
    if _HEX32.fullmatch(run_id) and int(run_id, 16):
        return int(run_id, 16)
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:16], "big") or 1


def span_id_of(run_id: str) -> int:
    """The (never recorded) parent span id of every span of a run."""
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[16:24], "big") or 1


#: What a span is when tracing is off (``nullcontext`` keeps no state: one serves every span).
_NO_SPAN: AbstractContextManager[None] = nullcontext()


class Tracing:
    """Starts spans when tracing is on; otherwise every span is a no-op costing nothing."""

    def __init__(self, enabled: bool = False, service: str = "wesichain-worker") -> None:
        self._tracer: Any = None
        if not enabled:
            return
        try:
            from opentelemetry import trace
        except ImportError as exc:
            raise ConfigError("WESICHAIN_OTEL=1 needs OpenTelemetry: pip install 'wesichain[otel]'") from exc
        _ensure_provider(service)
        self._tracer = trace.get_tracer("wesichain")

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def span(self, name: str, run_id: str, **attributes: Any) -> AbstractContextManager[Any]:
        """A span of ``run_id``'s trace; inside another span of this thread, its child. Yields the
        span (None when tracing is off); an exception leaving it is recorded on it."""
        if self._tracer is None:
            return _NO_SPAN  # not a generator's context manager: every phase has a span or two
        return self._span(name, run_id, attributes)

    @contextmanager
    def _span(self, name: str, run_id: str, attributes: dict[str, Any]) -> Iterator[Any]:
        from opentelemetry import context, trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

        attrs = {"wesichain.run_id": run_id, **{k: v for k, v in attributes.items() if v is not None}}
        current = trace.get_current_span()
        parent = None
        if not current.get_span_context().is_valid or current.get_span_context().trace_id != trace_id_of(
            run_id
        ):
            root = SpanContext(
                trace_id=trace_id_of(run_id),
                span_id=span_id_of(run_id),
                is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
            parent = trace.set_span_in_context(NonRecordingSpan(root), context.Context())
        with self._tracer.start_as_current_span(name, context=parent, attributes=attrs) as span:
            yield span


def _ensure_provider(service: str) -> None:
    from opentelemetry import trace

    if type(trace.get_tracer_provider()).__name__ != "ProxyTracerProvider":
        return  # the process (or a test) set one up: use it
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    exporter: SpanExporter
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    except ImportError:
        log.warning("no OTLP exporter installed (opentelemetry-exporter-otlp-proto-http): spans go to stdout")
        exporter = ConsoleSpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
