"""The wallet's coupon-redeemed outbox on real MariaDB and Kafka: one entry per redemption,
claims that neither block redemptions nor each other, several publishers sharing one table."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from flashcoupon_common.db.schema import redeemed_outbox
from flashcoupon_common.messages import CouponRedeemed
from flashcoupon_common.settings import KafkaSettings
from flashcoupon_wallet import outbox
from flashcoupon_wallet.app import create_app
from flashcoupon_wallet.publisher import RedeemedPublisher
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import Stack, random_name
from tests.integration.test_wallet_api import (
    USER,
    add_coupon,
    add_event,
    consume_all,
    free_port,
    serve,
    wallet_settings,
)
from tests.persister_support import wait_until


async def outbox_events(engine: AsyncEngine) -> list[CouponRedeemed]:
    """The outbox's entries, oldest first, as the messages they will be published as."""
    query = select(redeemed_outbox.c.payload).order_by(redeemed_outbox.c.id)
    async with engine.connect() as conn:
        return [CouponRedeemed.decode(p) for p in (await conn.scalars(query))]


async def wait_outbox_empty(engine: AsyncEngine, within: float = 20) -> None:
    async def empty() -> bool:
        return not await outbox_events(engine)

    assert await wait_until(empty, within), f"outbox not drained: {await outbox_events(engine)}"


def redeemed(i: int) -> CouponRedeemed:
    return CouponRedeemed(
        event_id="ev",
        user_id=f"user-{i % 7}",
        code=f"CODE{i:05d}",
        order_id=f"o-{i}",
        order_amount=1000 + i,
        discount_amount=100,
        redeemed_at_ms=int(datetime.now(UTC).timestamp() * 1000),
    )


async def test_a_replayed_redemption_adds_no_second_entry_nor_event(
    stack: Stack, mysql_url: str, mysql_engine: AsyncEngine, kafka_topic: str
) -> None:
    event = random_name("ev")
    await add_event(mysql_engine, event)
    code = await add_coupon(mysql_engine, event, "alice")
    body = {"orderId": "o-1", "orderAmount": 30_000}
    # Kafka unreachable: whatever the redemptions write stays in the outbox to be counted.
    down = wallet_settings(
        stack, mysql_url, kafka_topic, kafka=KafkaSettings(f"127.0.0.1:{free_port()}")
    )
    async with serve(create_app(down)) as c:
        url, alice = f"/v1/coupons/{code}/redeem", {USER: "alice"}
        first = await c.post(url, json=body, headers=alice)
        assert first.status_code == 200, first.text
        again = await asyncio.gather(*(c.post(url, json=body, headers=alice) for _ in range(20)))
        assert all(r.status_code == 200 and r.json() == first.json() for r in again)
        assert all(r.headers["idempotent-replayed"] == "true" for r in again)
        refused = await c.post(url, json={**body, "orderId": "o-2"}, headers=alice)
        assert refused.status_code == 409
        entries = await outbox_events(mysql_engine)
    assert [(e.code, e.order_id, e.order_amount, e.user_id, e.event_id) for e in entries] == [
        (code, "o-1", 30_000, "alice", event)
    ]
    assert entries[0].discount_amount == first.json()["discountAmount"]

    async with serve(create_app(wallet_settings(stack, mysql_url, kafka_topic))):
        await wait_outbox_empty(mysql_engine)
    events = [CouponRedeemed.decode(v) for v in await consume_all(stack, kafka_topic, want=1)]
    assert events == entries


async def test_a_claimed_batch_blocks_neither_redemptions_nor_another_replica(
    mysql_engine: AsyncEngine,
) -> None:
    a, b, c = redeemed(1), redeemed(2), redeemed(3)
    async with mysql_engine.begin() as conn:
        await outbox.add(conn, a)
        await outbox.add(conn, b)
    async with outbox.claim(mysql_engine, 10) as first:
        assert [CouponRedeemed.decode(e.payload) for e in first.entries] == [a, b]
        # A redemption committing now must not wait for this claim (a gap lock would make it).
        async with mysql_engine.connect() as conn:
            await conn.execute(text("SET SESSION innodb_lock_wait_timeout = 1"))
            await outbox.add(conn, c)
            await conn.commit()
        # Another replica skips what the first holds and gets only the new entry.
        async with outbox.claim(mysql_engine, 10) as second:
            assert [CouponRedeemed.decode(e.payload) for e in second.entries] == [c]
            await second.remove([e.id for e in second.entries])
        await first.remove([first.entries[0].id])  # Kafka acknowledged only `a`
    assert await outbox_events(mysql_engine) == [b]

    # A pass that fails after removing rolls back: the entry stays for the next one.
    with pytest.raises(RuntimeError):
        async with outbox.claim(mysql_engine, 10) as third:
            await third.remove([e.id for e in third.entries])
            raise RuntimeError("Kafka said no")
    assert await outbox_events(mysql_engine) == [b]


async def test_two_publishers_drain_one_outbox_each_entry_once(
    stack: Stack, mysql_engine: AsyncEngine, kafka_topic: str
) -> None:
    sent = [redeemed(i) for i in range(400)]
    async with mysql_engine.begin() as conn:
        for e in sent:
            await outbox.add(conn, e)
    publishers = [
        RedeemedPublisher(
            mysql_engine, stack.kafka.bootstrap, kafka_topic, batch_size=25, poll_seconds=0.2
        )
        for _ in range(2)
    ]
    for p in publishers:
        await p.start()
    try:
        await wait_outbox_empty(mysql_engine, within=30)
    finally:
        for p in publishers:
            await p.stop(5)
    got = [CouponRedeemed.decode(v) for v in await consume_all(stack, kafka_topic, want=400)]
    assert sorted(e.code for e in got) == [e.code for e in sent]  # none missing, none twice
