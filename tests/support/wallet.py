"""Wallet test helpers: catalog and coupon rows, the app in-process, its outbox and topic."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer
from flashcoupon_common.db.schema import coupon_events, redeemed_outbox, user_coupons
from flashcoupon_common.messages import CouponRedeemed
from flashcoupon_common.settings import MysqlSettings
from flashcoupon_wallet.settings import WalletSettings
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette

from tests.support.asgi import app_client
from tests.support.names import random_name
from tests.support.polling import wait_until
from tests.support.stack import Stack

USER = "X-Flashcoupon-User"


@contextlib.asynccontextmanager
async def serve(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan running (publisher included), and a client for it."""
    async with app_client(app, "http://wallet", timeout=30) as client:
        yield client


def wallet_settings(stack: Stack, mysql_url: str, topic: str, **over: Any) -> WalletSettings:
    return WalletSettings(
        mysql=MysqlSettings(mysql_url),
        kafka=over.pop("kafka", stack.kafka),
        redeemed_topic=topic,
        **over,
    )


async def add_event(engine: AsyncEngine, event_id: str) -> None:
    now = datetime.now(UTC).replace(tzinfo=None)
    async with engine.begin() as conn:
        await conn.execute(
            insert(coupon_events).values(
                id=event_id,
                title=event_id,
                quantity=100,
                per_user_limit=2,
                start_at=now - timedelta(hours=1),
                end_at=now + timedelta(hours=1),
                valid_for_seconds=86400,
                spec="{}",
            )
        )


async def add_coupon(
    engine: AsyncEngine,
    event_id: str,
    user_id: str,
    *,
    seq: int = 1,
    code: str | None = None,
    discount: dict[str, Any] | None = None,
    issued_ago: timedelta = timedelta(minutes=5),
    expires_in: timedelta = timedelta(days=30),
) -> str:
    code = code or random_name("c").replace("-", "").upper()
    now = datetime.now(UTC).replace(tzinfo=None)
    d = discount or {"discount_type": "fixed", "amount": 10_000}
    async with engine.begin() as conn:
        await conn.execute(
            insert(user_coupons).values(
                event_id=event_id,
                user_id=user_id,
                seq=seq,
                code=code,
                tier="big",
                issued_at=now - issued_ago,
                expires_at=now + expires_in,
                request_id=random_name("r"),
                **d,
            )
        )
    return code


async def consume_all(stack: Stack, topic: str, want: int, wait_s: float = 20) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=stack.kafka.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    await consumer.start()
    got: list[bytes] = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while len(got) < want and loop.time() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            got += [m.value for msgs in batches.values() for m in msgs if m.value is not None]
        # a little longer, so a duplicate would be seen too
        batches = await consumer.getmany(timeout_ms=1000)
        got += [m.value for msgs in batches.values() for m in msgs if m.value is not None]
    finally:
        await consumer.stop()
    return got


async def outbox_events(engine: AsyncEngine) -> list[CouponRedeemed]:
    """The outbox's entries, oldest first, as the messages they will be published as."""
    query = select(redeemed_outbox.c.payload).order_by(redeemed_outbox.c.id)
    async with engine.connect() as conn:
        return [CouponRedeemed.decode(p) for p in (await conn.scalars(query))]


async def wait_outbox_empty(engine: AsyncEngine, within: float = 20) -> None:
    async def empty() -> bool:
        return not await outbox_events(engine)

    assert await wait_until(empty, within), f"outbox not drained: {await outbox_events(engine)}"
