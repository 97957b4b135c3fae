"""Redelivery is harmless: one row per coupon however often Kafka hands it over."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer
from flashcoupon_persister import metrics
from flashcoupon_persister.bootstrap import running
from flashcoupon_persister.writer import BatchWriter
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import Stack, random_name
from tests.persister_support import (
    committed,
    count_rows,
    coupon,
    create_topic,
    delete_topics,
    end_offsets,
    engine_for,
    insert_event,
    produce_coupons,
    read_all,
    settings_for,
    wait_until,
)


@pytest.fixture
async def dlq_topic(stack: Stack) -> AsyncIterator[str]:
    name = await create_topic(stack.kafka.bootstrap, 1, prefix="dlq")
    yield name
    await delete_topics(stack.kafka.bootstrap, name)


@pytest.fixture
async def engine(mysql_url: str) -> AsyncIterator[AsyncEngine]:
    e = engine_for(mysql_url)
    yield e
    await e.dispose()


async def _drained(bootstrap: str, group: str, topic: str) -> bool:
    ends = await end_offsets(bootstrap, topic)
    return await committed(bootstrap, group, topic) == ends


def _dupes() -> float:
    return metrics.ROWS.labels("duplicate")._value.get()


async def test_same_batch_delivered_twice_gives_one_row_each(
    stack: Stack, kafka_topic: str, dlq_topic: str, mysql_url: str, engine: AsyncEngine
) -> None:
    bootstrap = stack.kafka.bootstrap
    event = random_name("ev")
    await insert_event(engine, event)
    batch = [coupon(event, n) for n in range(300)]
    await produce_coupons(bootstrap, kafka_topic, batch)
    await produce_coupons(bootstrap, kafka_topic, batch)  # a relay replaying its outbox
    group = random_name("g")
    before = _dupes()
    async with running(settings_for(bootstrap, mysql_url, kafka_topic, dlq_topic, group)):
        assert await wait_until(lambda: _drained(bootstrap, group, kafka_topic), 60)
    assert await count_rows(engine, event) == 300
    assert _dupes() - before == 300
    assert await read_all(bootstrap, dlq_topic, 1, within=2) == []


async def test_consumer_restarted_before_committing_gives_one_row_each(
    stack: Stack, kafka_topic: str, dlq_topic: str, mysql_url: str, engine: AsyncEngine
) -> None:
    bootstrap = stack.kafka.bootstrap
    event = random_name("ev")
    await insert_event(engine, event)
    batch = [coupon(event, n) for n in range(200)]
    await produce_coupons(bootstrap, kafka_topic, batch)
    group = random_name("g")

    # A first member writes everything to MySQL and dies before committing any offset.
    first = AIOKafkaConsumer(
        kafka_topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await first.start()
    try:
        seen = []
        while len(seen) < len(batch):
            for recs in (await first.getmany(timeout_ms=1000)).values():
                seen.extend(recs)
        result = await BatchWriter(engine).write([type(batch[0]).decode(r.value) for r in seen])
        assert result.inserted == 200
    finally:
        await first.stop()
    assert await committed(bootstrap, group, kafka_topic) in ({}, {0: -1, 1: -1, 2: -1})

    before = _dupes()
    async with running(settings_for(bootstrap, mysql_url, kafka_topic, dlq_topic, group)):
        assert await wait_until(lambda: _drained(bootstrap, group, kafka_topic), 60)
    assert await count_rows(engine, event) == 200
    assert _dupes() - before == 200
