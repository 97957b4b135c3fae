"""The batch writer against a real MariaDB: duplicates absorbed, conflicts and poison isolated."""

from __future__ import annotations

import dataclasses
from datetime import datetime

from flashcoupon_persister.writer import BatchWriter
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.names import random_name
from tests.support.persister import codes, count_rows, coupon, engine_for, insert_event


async def _writer(mysql_url: str) -> tuple[BatchWriter, AsyncEngine]:
    engine = engine_for(mysql_url)
    return BatchWriter(engine), engine


async def test_batch_twice_stores_each_coupon_once(mysql_url: str) -> None:
    writer, engine = await _writer(mysql_url)
    try:
        event = random_name("ev")
        await insert_event(engine, event)
        batch = [coupon(event, n) for n in range(200)]
        first = await writer.write(batch)
        assert (first.inserted, first.duplicates, first.rejected) == (200, 0, [])
        # Half old, half new, and one record twice inside the same batch.
        again = batch[100:] + [coupon(event, n) for n in range(200, 300)] + [batch[0]]
        second = await writer.write(again)
        assert (second.inserted, second.duplicates, second.rejected) == (100, 101, [])
        assert await count_rows(engine, event) == 300
    finally:
        await engine.dispose()


async def test_conflicts_are_rejected_not_absorbed(mysql_url: str) -> None:
    writer, engine = await _writer(mysql_url)
    try:
        event = random_name("ev")
        await insert_event(engine, event)
        a = coupon(event, 1)
        await writer.write([a])
        code_clash = coupon(event, 2, code=a.code)  # another slot claims a's code
        slot_clash = dataclasses.replace(a, code="OTHERCODE1")  # a's slot with another code
        fine = coupon(event, 3)
        res = await writer.write([code_clash, fine, slot_clash, a])
        assert res.inserted == 1 and res.duplicates == 1
        assert sorted((r.index, r.code) for r in res.rejected) == [
            (0, "CODE_CONFLICT"),
            (2, "SLOT_CONFLICT"),
        ]
        assert a.code in res.rejected[1].detail or a.code in res.rejected[0].detail
        assert await codes(engine, event) == sorted([a.code, fine.code])
    finally:
        await engine.dispose()


async def test_poison_rows_are_isolated_and_the_rest_committed(mysql_url: str) -> None:
    writer, engine = await _writer(mysql_url)
    try:
        event = random_name("ev")
        await insert_event(engine, event)
        good = [coupon(event, n) for n in range(10)]
        no_catalog = coupon(random_name("missing"), 99)  # FK: event not in coupon_events
        too_long = dataclasses.replace(coupon(event, 98), tier="x" * 200)  # VARCHAR(63)
        batch = [*good[:5], no_catalog, *good[5:], too_long]
        res = await writer.write(batch)
        assert res.inserted == 10 and res.duplicates == 0
        assert sorted((r.index, r.code, r.reason) for r in res.rejected) == [
            (5, "MYSQL_1452", "constraint"),
            (11, "MYSQL_1406", "constraint"),
        ]
        assert await count_rows(engine, event) == 10
    finally:
        await engine.dispose()


async def test_session_is_strict_and_utc(mysql_url: str) -> None:
    _, engine = await _writer(mysql_url)
    try:
        async with engine.connect() as conn:
            mode, tz = (await conn.execute(text("SELECT @@sql_mode, @@time_zone"))).one()
        assert "STRICT_ALL_TABLES" in mode and tz == "+00:00"
    finally:
        await engine.dispose()


async def test_stored_values_round_trip(mysql_url: str) -> None:
    writer, engine = await _writer(mysql_url)
    try:
        event = random_name("ev")
        await insert_event(engine, event)
        c = dataclasses.replace(
            coupon(event, 7), issued_at_ms=1_780_000_000_123, expires_at_ms=1_790_000_000_999
        )
        await writer.write([c])
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT issued_at, expires_at, status, request_id, discount_type,"
                        " percent, max_amount FROM user_coupons WHERE code=:c"
                    ),
                    {"c": c.code},
                )
            ).one()
        assert row.issued_at == datetime(2026, 5, 28, 20, 26, 40, 123000)
        assert row.expires_at == datetime(2026, 9, 21, 14, 13, 20, 999000)
        assert (row.status, row.request_id) == ("issued", c.request_id)
        assert (row.discount_type, row.percent, row.max_amount) == ("percent", 5, 3000)
    finally:
        await engine.dispose()


async def test_redelivery_never_touches_a_redeemed_coupon(mysql_url: str) -> None:
    writer, engine = await _writer(mysql_url)
    try:
        event = random_name("ev")
        await insert_event(engine, event)
        c = coupon(event, 1)
        await writer.write([c])
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "UPDATE user_coupons SET status='redeemed', order_id='o-1',"
                    " redeemed_at=NOW(3) WHERE code=:c"
                ),
                {"c": c.code},
            )
        res = await writer.write([c])  # the issued record, replayed by Kafka
        assert (res.inserted, res.duplicates, res.rejected) == (0, 1, [])
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    text("SELECT status, order_id FROM user_coupons WHERE code=:c"), {"c": c.code}
                )
            ).one()
        assert (row.status, row.order_id) == ("redeemed", "o-1")
    finally:
        await engine.dispose()
