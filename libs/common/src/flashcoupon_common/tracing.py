"""OpenTelemetry tracing, configured only by the standard `OTEL_*` variables, off by default.

`setup(service)` is called once per process at start-up. With `OTEL_TRACES_EXPORTER` unset or
`none` it does nothing: no provider, and `ENABLED` stays False. The one subtle point is that
flag: hot paths test `tracing.ENABLED` (a module attribute, read at call time: import the
module, never the name) before building any span, header dict or context, so tracing that is
off costs one attribute load per request (the bench_tracing benchmark measures it).

With `OTEL_TRACES_EXPORTER=otlp` spans go through a BatchSpanProcessor (`OTEL_BSP_*`) to the
OTLP/HTTP exporter (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`);
`console` prints them. The sampler is the SDK's (`OTEL_TRACES_SAMPLER`, default
parentbased_always_on) and `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` override the
service name given here. Spans still queued are flushed by `flush()`, which each service's
lifespan awaits on shutdown (uvicorn re-raises SIGTERM after its graceful shutdown, so atexit
handlers never run), and at a normal exit.

Trace context crosses processes as a W3C `traceparent` string: an HTTP header, the outbox
entry's `tp` field, a Kafka record header. `span(name, traceparent)` starts a span whose parent
is that string (a new trace when it is empty or malformed); `traceparent_of(span)` is the
string to pass on.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

__all__ = ["Span", "SpanKind"]  # re-exported for type hints in services
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

logger = logging.getLogger(__name__)

# True once setup() installed a provider; read as `tracing.ENABLED` on hot paths.
ENABLED = False

_PROPAGATOR = TraceContextTextMapPropagator()
_tracer: trace.Tracer = trace.NoOpTracer()
_provider: Any = None  # the SDK TracerProvider while enabled

SERVER = SpanKind.SERVER
INTERNAL = SpanKind.INTERNAL
PRODUCER = SpanKind.PRODUCER
CONSUMER = SpanKind.CONSUMER


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The exporters OTEL_TRACES_EXPORTER asks for (comma-separated); [] means tracing off."""
    raw = environ.get("OTEL_TRACES_EXPORTER", "")
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    return [] if not names or names == ["none"] else [n for n in names if n != "none"]


def resource_attributes(service: str, environ: Mapping[str, str]) -> dict[str, str]:
    """`service.name` from the caller unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES name
    one (the SDK's resource detector reads those; attributes passed here would win over them)."""
    if environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        return {}
    return {"service.name": f"flashcoupon-{service}"}


def setup(service: str, environ: Mapping[str, str] | None = None) -> bool:
    """Install the tracer provider the OTEL_* variables ask for; True when tracing is on."""
    env = os.environ if environ is None else environ
    names = exporter_names(env)
    if not names or ENABLED:
        return ENABLED
    exporters: list[Any] = []
    for name in names:
        if name == "otlp":
            protocol = env.get(
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
            )
            if protocol not in ("", "http/protobuf"):
                logger.warning(
                    "tracing: OTLP protocol %r is not installed; using http/protobuf", protocol
                )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
        else:
            logger.warning("tracing: unknown OTEL_TRACES_EXPORTER %r ignored", name)
    if not exporters:
        return False
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    install([BatchSpanProcessor(e) for e in exporters], service, env)
    logger.info("tracing on: exporters %s", ",".join(names))
    return True


def install(processors: list[Any], service: str, environ: Mapping[str, str] | None = None) -> Any:
    """Install an SDK provider with these span processors (setup's core; tests pass an
    in-memory exporter's processor). Returns the provider."""
    global ENABLED, _tracer, _provider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    env = os.environ if environ is None else environ
    provider = TracerProvider(
        resource=Resource.create(resource_attributes(service, env)), shutdown_on_exit=False
    )
    for p in processors:
        provider.add_span_processor(p)
    _provider, _tracer, ENABLED = provider, provider.get_tracer("flashcoupon"), True
    trace.set_tracer_provider(provider)
    atexit.register(shutdown)  # a normal exit; a SIGTERMed service flushes in its lifespan
    return provider


async def flush(timeout_ms: int = 5000) -> None:
    """Export the spans still queued; each service's lifespan awaits it on shutdown. Needed
    because uvicorn ends a process that got SIGTERM by re-raising the signal after its graceful
    shutdown, so atexit handlers do not run; it runs in a thread, off the event loop."""
    provider = _provider
    if provider is not None:
        await asyncio.to_thread(provider.force_flush, timeout_ms)


def shutdown() -> None:
    """Flush queued spans and stop exporting (idempotent)."""
    global ENABLED, _provider, _tracer
    provider, _provider, ENABLED, _tracer = _provider, None, False, trace.NoOpTracer()
    if provider is not None:
        provider.shutdown()


def parent(traceparent: str | bytes | None, tracestate: str | bytes | None = None) -> Any:
    """The OpenTelemetry context whose remote parent is this W3C traceparent (or a root)."""
    if not traceparent:
        return otel_context.Context()
    carrier = {"traceparent": _text(traceparent)}
    if tracestate:
        carrier["tracestate"] = _text(tracestate)
    return _PROPAGATOR.extract(carrier, context=otel_context.Context())


@contextmanager
def span(
    name: str,
    traceparent: str | bytes | None = None,
    *,
    kind: SpanKind = INTERNAL,
    attributes: Mapping[str, Any] | None = None,
    tracestate: str | bytes | None = None,
) -> Iterator[Span]:
    """A current span: a child of `traceparent` when one is given, else of the current span."""
    ctx = parent(traceparent, tracestate) if traceparent else None
    with _tracer.start_as_current_span(name, context=ctx, kind=kind, attributes=attributes) as s:
        yield s


def start(
    name: str,
    traceparent: str | bytes | None,
    *,
    kind: SpanKind = INTERNAL,
    attributes: Mapping[str, Any] | None = None,
) -> Span:
    """A span that is not made current (ended by the caller): for one record of a batch."""
    return _tracer.start_span(name, context=parent(traceparent), kind=kind, attributes=attributes)


def traceparent_of(s: Span) -> str:
    """The W3C traceparent naming this span as the parent ('' for a non-recording no-op)."""
    ctx = s.get_span_context()
    if not ctx.is_valid:
        return ""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def inject(headers: dict[str, str]) -> None:
    """Replace traceparent/tracestate in outgoing headers with the current span's (kept as
    they are when no span is current)."""
    if trace.get_current_span().get_span_context().is_valid:
        headers.pop("tracestate", None)
        _PROPAGATOR.inject(headers)


def header(headers: Any, name: str = "traceparent") -> bytes | None:
    """A header's value from Kafka-style [(name, bytes)] pairs, or None."""
    for key, value in headers or ():
        if key == name:
            return bytes(value) if value is not None else None
    return None


def _text(v: str | bytes) -> str:
    return v.decode("latin-1") if isinstance(v, bytes) else v
