"""A redemption stands while Kafka is unreachable; its coupon-redeemed event follows later.

"Unreachable" is real: the wallet's bootstrap address is a port nothing listens on. Meanwhile
the event waits in the outbox table (and the pending gauge says so). Later the test opens a TCP
forwarder to the real broker on that port, as a broker coming back would.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import httpx
from flashcoupon_common.messages import CouponRedeemed
from flashcoupon_common.settings import KafkaSettings
from flashcoupon_wallet.app import create_app
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.metrics import scraped_exactly
from tests.support.names import random_name
from tests.support.ports import free_port
from tests.support.stack import Stack
from tests.support.wallet import (
    USER,
    add_coupon,
    add_event,
    consume_all,
    outbox_events,
    serve,
    wallet_settings,
)


@contextlib.asynccontextmanager
async def forwarder(port: int, target: str) -> AsyncIterator[None]:
    host, target_port = target.rsplit(":", 1)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(target_port))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    try:
        yield
    finally:
        server.close()


async def wait_metric(c: httpx.AsyncClient, name: str, ok: object, wait_s: float) -> float:
    deadline = time.monotonic() + wait_s
    while True:
        value = scraped_exactly((await c.get("/metrics")).text, name)
        if ok(value) or time.monotonic() > deadline:  # type: ignore[operator]
            return value
        await asyncio.sleep(0.2)


async def test_redemption_succeeds_while_kafka_is_down_and_is_published_after(
    stack: Stack, mysql_url: str, mysql_engine: AsyncEngine, kafka_topic: str
) -> None:
    event = random_name("ev")
    await add_event(mysql_engine, event)
    code = await add_coupon(mysql_engine, event, "alice")
    port = free_port()
    settings = wallet_settings(
        stack, mysql_url, kafka_topic, kafka=KafkaSettings(f"127.0.0.1:{port}")
    )
    async with serve(create_app(settings)) as c:
        failures0 = scraped_exactly(
            (await c.get("/metrics")).text, "flashcoupon_wallet_redeemed_publish_failures_total"
        )
        started = time.monotonic()
        r = await c.post(
            f"/v1/coupons/{code}/redeem",
            json={"orderId": "o-1", "orderAmount": 30_000},
            headers={USER: "alice"},
        )
        assert r.status_code == 200, r.text
        assert time.monotonic() - started < 2, "the answer waited for Kafka"
        failures = await wait_metric(
            c,
            "flashcoupon_wallet_redeemed_publish_failures_total",
            lambda v: v > failures0,
            10,
        )
        assert failures > failures0
        # The backlog gauges are refreshed between publishing passes, and a pass against an
        # unreachable broker lasts as long as its bootstrap attempt: poll, never a fixed sleep
        # (a 1.5 s sleep failed on a loaded CI machine).
        pending = await wait_metric(
            c, "flashcoupon_wallet_redeemed_outbox_length", lambda v: v >= 1, 30
        )
        assert pending >= 1
        oldest = await wait_metric(
            c, "flashcoupon_wallet_redeemed_outbox_oldest_age_seconds", lambda v: v > 0, 30
        )
        assert oldest > 0
        failures_later = await wait_metric(
            c,
            "flashcoupon_wallet_redeemed_publish_failures_total",
            lambda v: v > failures + 1,
            30,
        )
        assert failures_later > failures + 1, "an outage of a few retries, not one blip"
        assert [(e.code, e.order_id) for e in await outbox_events(mysql_engine)] == [(code, "o-1")]
        assert (await c.get("/readyz")).status_code == 200  # Kafka does not decide readiness

        async with forwarder(port, stack.kafka.bootstrap):
            pending = await wait_metric(
                c, "flashcoupon_wallet_redeemed_outbox_length", lambda v: v == 0, 30
            )
            assert pending == 0
            assert await outbox_events(mysql_engine) == []
    values = await consume_all(stack, kafka_topic, want=1)
    events = [CouponRedeemed.decode(v) for v in values]
    assert [(e.code, e.order_id, e.order_amount) for e in events] == [(code, "o-1", 30_000)]
