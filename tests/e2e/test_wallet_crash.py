"""A wallet that dies after answering 200 does not lose the coupon-redeemed event.

The wallet runs as a process with Kafka unreachable (a port nothing listens on), redeems, and
is SIGKILLed: no shutdown code runs. A new wallet instance pointed at the real broker finds the
event in the outbox at start-up and publishes it — once — without any request.
"""

from __future__ import annotations

import signal
import subprocess

import httpx
from flashcoupon_common.messages import CouponRedeemed
from flashcoupon_wallet.app import create_app
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import Stack, random_name
from tests.e2e.test_wallet_process import start_wallet, wait_ready
from tests.integration.test_wallet_api import (
    USER,
    add_coupon,
    add_event,
    consume_all,
    free_port,
    serve,
    wallet_settings,
)
from tests.integration.test_wallet_outbox import outbox_events, wait_outbox_empty


async def test_event_of_a_sigkilled_wallet_is_published_by_the_next_one(
    stack: Stack, mysql_url: str, mysql_engine: AsyncEngine, kafka_topic: str
) -> None:
    event = random_name("ev")
    await add_event(mysql_engine, event)
    code = await add_coupon(mysql_engine, event, "alice")
    unreachable = f"127.0.0.1:{free_port()}"  # a port nothing listens on
    proc, url = start_wallet(
        stack,
        mysql_url,
        kafka_topic,
        output=subprocess.DEVNULL,  # it logs a retry per backoff; nobody reads a pipe
        FLASHCOUPON_KAFKA_BOOTSTRAP=unreachable,
    )
    try:
        await wait_ready(url, proc)
        async with httpx.AsyncClient(base_url=url) as c:
            r = await c.post(
                f"/v1/coupons/{code}/redeem",
                json={"orderId": "o-crash", "orderAmount": 40_000},
                headers={USER: "alice"},
            )
            assert r.status_code == 200, r.text
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    left = await outbox_events(mysql_engine)
    assert [(e.code, e.order_id) for e in left] == [(code, "o-crash")]

    async with serve(create_app(wallet_settings(stack, mysql_url, kafka_topic))):
        await wait_outbox_empty(mysql_engine)
    events = [CouponRedeemed.decode(v) for v in await consume_all(stack, kafka_topic, want=1)]
    assert events == left
    assert (events[0].user_id, events[0].discount_amount) == ("alice", 10_000)
