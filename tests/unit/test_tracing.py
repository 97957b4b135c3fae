"""Tracing: off unless OTEL_TRACES_EXPORTER asks, one trace id across the hops, logs that carry
it. Spans go to the SDK's in-memory exporter; the hops are the real functions each service
calls (the gateway's header injection, the issuer's edge, the relay's and persister's spans)."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
from aiokafka.structs import ConsumerRecord
from flashcoupon_common import tracing
from flashcoupon_common.logsetup import JSONFormatter
from flashcoupon_common.messages import CouponIssued, Discount
from flashcoupon_issuer.http import IssueEdge
from flashcoupon_issuer.issuance import IssueService, SoldOutCache
from flashcoupon_persister.spans import write_spans
from flashcoupon_relay.delivery import publish_spans
from flashcoupon_relay.policy import Outgoing
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette

from tests.support.issuer import NOBODY, per_press

CLIENT_TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACE_ID = int("0af7651916cd43dd8448eb211c80319c", 16)
COUPON = [b"ABCD0123456789", b"big", b"fixed", b"10000", b"", b"", 1_000, 61_000]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.install([SimpleSpanProcessor(exporter)], "test", {})
    try:
        yield exporter
    finally:
        tracing.shutdown()
    assert not tracing.ENABLED


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in exporter.get_finished_spans()}


def test_off_unless_an_exporter_is_named() -> None:
    assert tracing.exporter_names({}) == []
    assert tracing.exporter_names({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert tracing.exporter_names({"OTEL_TRACES_EXPORTER": " OTLP , console"}) == [
        "otlp",
        "console",
    ]
    assert tracing.setup("gateway", {}) is False
    assert tracing.setup("gateway", {"OTEL_TRACES_EXPORTER": "none"}) is False
    assert tracing.setup("gateway", {"OTEL_TRACES_EXPORTER": "zipkin-nope"}) is False
    assert not tracing.ENABLED


def test_service_name_defaults_unless_the_otel_variables_name_one() -> None:
    assert tracing.resource_attributes("relay", {}) == {"service.name": "flashcoupon-relay"}
    assert tracing.resource_attributes("relay", {"OTEL_SERVICE_NAME": "r2"}) == {}
    env = {"OTEL_RESOURCE_ATTRIBUTES": "team=x,service.name=r3"}
    assert tracing.resource_attributes("relay", env) == {}


def test_a_span_continues_the_callers_trace(spans: InMemorySpanExporter) -> None:
    with tracing.span("gw", CLIENT_TP, kind=tracing.SERVER) as s:
        tp = tracing.traceparent_of(s)
        headers = {"traceparent": CLIENT_TP, "tracestate": "a=b"}
        tracing.inject(headers)
    assert headers["traceparent"] == tp != CLIENT_TP and "tracestate" not in headers
    (gw,) = spans.get_finished_spans()
    assert gw.context is not None and gw.parent is not None
    assert gw.context.trace_id == TRACE_ID and gw.parent.span_id == 0xB7AD6B7169203331
    assert tp == f"00-{TRACE_ID:032x}-{gw.context.span_id:016x}-01"
    with tracing.span("root", "not-a-traceparent") as s:
        assert s.get_span_context().trace_id != TRACE_ID  # a malformed parent starts a trace


def test_without_a_current_span_inject_keeps_the_clients_headers(
    spans: InMemorySpanExporter,
) -> None:
    headers = {"traceparent": CLIENT_TP, "tracestate": "a=b"}
    tracing.inject(headers)
    assert headers == {"traceparent": CLIENT_TP, "tracestate": "a=b"}


@contextmanager
def json_lines(name: str) -> Iterator[list[dict[str, Any]]]:
    """The JSON lines a logger writes (formatted as they are emitted: inside the span)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JSONFormatter("test"))
    log = logging.getLogger(name)
    log.addHandler(handler)
    level, log.level = log.level, logging.DEBUG
    lines: list[dict[str, Any]] = []
    try:
        yield lines
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        lines.extend(orjson.loads(line) for line in out.getvalue().splitlines())


def test_log_lines_inside_a_span_carry_its_ids(spans: InMemorySpanExporter) -> None:
    log = logging.getLogger("test.tracing")
    with json_lines("test.tracing") as lines:
        with tracing.span("work", CLIENT_TP) as s:
            log.warning("inside")
        log.warning("outside")
    inside, outside = lines
    assert inside["trace_id"] == f"{TRACE_ID:032x}"
    assert inside["span_id"] == f"{s.get_span_context().span_id:016x}"
    assert "trace_id" not in outside


async def _post(app: IssueEdge, service: IssueService, tp: str) -> int:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/internal/v1/events/ev1/issue",
        "headers": [(b"x-flashcoupon-user", b"alice"), (b"traceparent", tp.encode())],
        "state": {"service": service},
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return int(sent[0]["status"])


def test_the_issuer_records_its_own_span_in_the_outbox_and_logs_in_it(
    spans: InMemorySpanExporter,
) -> None:
    written: list[str] = []

    async def call(
        event_id: str, user: str, rid: str, tp: str, deadline: float | None, allowance: Any
    ) -> Any:
        written.append(tp)
        return [b"ISSUED", 41, 0, 1, *COUPON]

    service = IssueService(per_press(call), SoldOutCache(1.0), holders=NOBODY)
    with json_lines("flashcoupon_issuer.http") as lines:
        status = asyncio.run(_post(IssueEdge(Starlette()), service, CLIENT_TP))
    assert status == 201
    got = by_name(spans)
    server, script = got["POST /internal/v1/events/{eventId}/issue"], got["redis issue.lua"]
    assert server.context is not None and script.context is not None
    assert server.context.trace_id == script.context.trace_id == TRACE_ID
    assert script.parent is not None and script.parent.span_id == server.context.span_id
    assert written == [f"00-{TRACE_ID:032x}-{server.context.span_id:016x}-01"]
    assert script.attributes is not None and script.attributes["flashcoupon.outcome"] == "ISSUED"
    assert [line["trace_id"] for line in lines] == [f"{TRACE_ID:032x}"]


def test_relay_and_persister_spans_chain_through_the_headers(
    spans: InMemorySpanExporter,
) -> None:
    coupon = CouponIssued(
        event_id="ev1",
        user_id="alice",
        seq=1,
        code="ABCD0123456789",
        tier="big",
        discount=Discount("fixed", amount=10000),
        issued_at_ms=1_000,
        expires_at_ms=61_000,
        request_id="r1",
    )
    outgoing = [
        Outgoing(
            "1-0", "t", b"k", b"v", [("traceparent", CLIENT_TP.encode()), ("event-id", b"ev1")]
        ),
        Outgoing("2-0", "t", b"k", b"v", [("event-id", b"ev1")]),  # no trace: no span
    ]
    relay = publish_spans(outgoing, "coupon-issued")
    assert list(relay) == ["1-0"]
    relay["1-0"].end()
    header = outgoing[0].headers[0][1]
    record: ConsumerRecord[bytes, bytes] = ConsumerRecord(
        "t", 0, 7, 0, 0, b"k", b"v", None, 1, 1, [("traceparent", header)]
    )
    for s in write_spans([record], [coupon]):
        s.end()
    got = by_name(spans)
    publish, store = got["publish coupon-issued"], got["store coupon"]
    assert publish.context is not None and store.context is not None
    assert publish.context.trace_id == store.context.trace_id == TRACE_ID
    assert store.parent is not None and store.parent.span_id == publish.context.span_id
    assert header == tracing.traceparent_of(relay["1-0"]).encode()
