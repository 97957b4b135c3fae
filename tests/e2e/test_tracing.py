"""One issue request, one trace: gateway → issuer (and its script call) → outbox → relay →
Kafka → persister (the DB write), all four services as processes exporting to a real Jaeger v2
(scripts/tracing.sh, started here when it is not running), read back from its query API."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from flashcoupon_loadtest import jaeger
from flashcoupon_loadtest.localrun import LocalServices

from tests.support.gateway import SECRET, bearer, provision
from tests.support.names import random_name
from tests.support.paths import BIN
from tests.support.persister import count_rows, create_topic, engine_for, insert_event
from tests.support.polling import wait_until
from tests.support.ports import free_port
from tests.support.processes import Proc
from tests.support.stack import Stack

SERVICES = (
    "flashcoupon-gateway",
    "flashcoupon-issuer",
    "flashcoupon-relay",
    "flashcoupon-persister",
)
# Spans are exported in batches (200 ms here) and the relay and persister act asynchronously;
# a busy CI machine can take tens of seconds for all of it.
TRACE_WAIT_S = 90


# The first test's setup may wait for Jaeger's cold build (about 10 minutes on 2 busy cores),
# which `make test` started in the background (make tools-background).
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="session")
def jaeger_backend() -> Iterator[None]:
    """The local Jaeger: the one already running (make tracing-up), or one started for the
    session and stopped after it."""
    started = not jaeger.running()
    if started:
        jaeger.up()
    yield
    if started:
        jaeger.down()


def parent_of(span: dict[str, Any]) -> str | None:
    refs = [r for r in span.get("references", []) if r["refType"] == "CHILD_OF"]
    return refs[0]["spanID"] if refs else None


def log_lines(path: Path) -> list[dict[str, Any]]:
    lines = []
    for raw in path.read_text(errors="replace").splitlines():
        try:
            lines.append(orjson.loads(raw))
        except orjson.JSONDecodeError:
            continue  # uvicorn's or a library's plain line
    return lines


async def test_one_issue_request_is_one_trace_across_all_four_services(
    jaeger_backend: None,
    stack: Stack,
    redis_cluster: Any,
    kafka_topic: str,
    mysql_url: str,
    tmp_path: Path,
) -> None:
    spec = await provision(redis_cluster, quantity=10)
    event = spec.event_id
    engine = engine_for(mysql_url)
    await insert_event(engine, event)
    dlq = await create_topic(stack.kafka.bootstrap, 1, prefix="dlq")
    env = {**stack.env(), "FLASHCOUPON_MYSQL_URL": mysql_url, **jaeger.otel_env()}
    services = LocalServices(
        gateways=1,
        issuers=1,
        relays=1,
        persisters=1,
        wallet=False,
        jwt_secret=SECRET,
        env=env,
        per_service_env={
            "issuer": {"FLASHCOUPON_LOG_LEVEL": "DEBUG"},
            "relay": {
                "FLASHCOUPON_RELAY_TOPIC": kafka_topic,
                "FLASHCOUPON_RELAY_DLQ_TOPIC": dlq,
                "FLASHCOUPON_RELAY_EVENTS": event,
                "FLASHCOUPON_RELAY_CONSUMER": random_name("relay"),
                "FLASHCOUPON_RELAY_BLOCK_MS": "200",
                "FLASHCOUPON_RELAY_REGISTRY_REFRESH_MS": "200",
            },
            "persister": {
                "FLASHCOUPON_PERSISTER_TOPIC": kafka_topic,
                "FLASHCOUPON_PERSISTER_DLQ_TOPIC": dlq,
                "FLASHCOUPON_PERSISTER_GROUP_ID": random_name("g"),
            },
        },
        log_dir=tmp_path / "logs",
    )
    trace_id, client_span = os.urandom(16).hex(), os.urandom(8).hex()
    await asyncio.to_thread(services.start)
    try:
        async with httpx.AsyncClient(base_url=services.gateway_urls[0], timeout=30) as client:
            r = await client.post(
                f"/v1/events/{event}/issue",
                headers={**bearer("tracy"), "traceparent": f"00-{trace_id}-{client_span}-01"},
            )
        assert r.status_code == 201, r.text
        # The coupon reached MySQL: the persister's span is at most one export away.
        assert await wait_until(
            lambda: _stored(engine, event), TRACE_WAIT_S, 0.2, what="the coupon's row"
        )
        found: dict[str, Any] = {}

        async def whole_trace() -> bool:
            t = await asyncio.to_thread(jaeger.get_trace, trace_id)
            found["trace"] = t
            return t is not None and set(SERVICES) <= set(jaeger.services_of(t))

        assert await wait_until(whole_trace, TRACE_WAIT_S, 0.5, what="spans of all four services")
        issuer_log = log_lines(tmp_path / "logs" / "svc-issuer-1.log")
    finally:
        await asyncio.to_thread(services.stop)
        await engine.dispose()

    trace = found["trace"]
    by_service = jaeger.services_of(trace)
    processes = trace["processes"]
    spans = {
        (processes[s["processID"]]["serviceName"], s["operationName"]): s for s in trace["spans"]
    }
    gateway = spans["flashcoupon-gateway", "POST /v1/events/{eventId}/issue"]
    issuer = spans["flashcoupon-issuer", "POST /internal/v1/events/{eventId}/issue"]
    script = spans["flashcoupon-issuer", "redis issue.lua"]
    relay = spans["flashcoupon-relay", f"publish {kafka_topic}"]
    persister = spans["flashcoupon-persister", "store coupon"]
    # One chain: the shopper's span → gateway → issuer → (script) / relay → persister.
    assert parent_of(gateway) == client_span, by_service
    assert parent_of(issuer) == gateway["spanID"]
    assert parent_of(script) == issuer["spanID"]
    assert parent_of(relay) == issuer["spanID"]  # the outbox entry's traceparent
    assert parent_of(persister) == relay["spanID"]  # the Kafka record's traceparent header
    assert {t["key"]: t["value"] for t in script["tags"]}["flashcoupon.outcome"] == "ISSUED"
    # The issuer's log line written inside its span carries the trace id.
    assert any(line.get("trace_id") == trace_id for line in issuer_log), issuer_log[-5:]


async def _stored(engine: Any, event: str) -> bool:
    return await count_rows(engine, event) == 1


async def test_spans_still_queued_are_exported_when_the_process_gets_sigterm(
    jaeger_backend: None, stack: Stack
) -> None:
    # An export interval far longer than the test: the span can only arrive through the flush
    # in the lifespan's shutdown (uvicorn re-raises SIGTERM, so atexit handlers never run).
    env = {**stack.env(), **jaeger.otel_env(delay_ms=600_000)}
    issuer = Proc([str(BIN / "flashcoupon-issuer")], env, free_port()).start()
    trace_id = os.urandom(16).hex()
    try:
        async with httpx.AsyncClient(base_url=issuer.url, timeout=30) as client:
            r = await client.post(
                f"/internal/v1/events/{random_name('none')}/issue",
                headers={"X-Flashcoupon-User": "u", "traceparent": f"00-{trace_id}-{'1' * 16}-01"},
            )
        assert r.status_code == 404, r.text
    finally:
        issuer.stop()  # SIGTERM, then wait for the exit

    async def exported() -> bool:
        return await asyncio.to_thread(jaeger.get_trace, trace_id) is not None

    assert await wait_until(exported, TRACE_WAIT_S, 0.5, what="the flushed span in Jaeger")
