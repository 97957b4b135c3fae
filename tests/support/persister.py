"""Helpers for the persister tests: catalog rows, records, topics, offsets, waiting."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from flashcoupon_common.db.migrate import upgrade
from flashcoupon_common.db.schema import coupon_events, user_coupons
from flashcoupon_common.kafka_admin import committed_offsets as committed
from flashcoupon_common.kafka_admin import create_topics, delete_topics
from flashcoupon_common.messages import CouponIssued, Discount
from flashcoupon_common.settings import KafkaSettings, MysqlSettings
from flashcoupon_persister import metrics
from flashcoupon_persister.app import create_app
from flashcoupon_persister.settings import PersisterSettings
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.support.asgi import app_client
from tests.support.names import random_name
from tests.support.polling import wait_until
from tests.support.private_stack import PrivateServer, private_mariadb


async def insert_event(engine: AsyncEngine, event_id: str, quantity: int = 100_000) -> None:
    """The coupon_events catalog row every user_coupons row references (FK)."""
    async with engine.begin() as conn:
        await conn.execute(
            coupon_events.insert().values(
                id=event_id,
                title=f"test {event_id}",
                quantity=quantity,
                per_user_limit=2,
                start_at=datetime(2026, 1, 1),
                end_at=datetime(2027, 1, 1),
                valid_for_seconds=86400,
                spec="{}",
            )
        )


def coupon(
    event_id: str, n: int, *, user: str | None = None, seq: int = 1, code: str | None = None
) -> CouponIssued:
    return CouponIssued(
        event_id=event_id,
        user_id=user or f"user-{n}",
        seq=seq,
        code=code or f"C{n:08d}{event_id[-6:].upper()}",
        tier="small",
        discount=Discount("percent", percent=5, max_amount=3000),
        issued_at_ms=1_780_000_000_000 + n,
        expires_at_ms=1_790_000_000_000 + n,
        request_id=uuid.uuid4().hex,
    )


async def create_topic(bootstrap: str, partitions: int = 3, prefix: str = "t") -> str:
    name = random_name(prefix)
    await create_topics(bootstrap, name, partitions=partitions)
    return name


async def produce(
    bootstrap: str,
    topic: str,
    items: Sequence[tuple[bytes | None, bytes]],
    *,
    partition: int | None = None,
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value=v, key=k, partition=partition) for k, v in items
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def produce_coupons(
    bootstrap: str, topic: str, coupons: Sequence[CouponIssued], *, partition: int | None = None
) -> None:
    await produce(
        bootstrap, topic, [(c.kafka_key(), c.encode()) for c in coupons], partition=partition
    )


async def read_all(bootstrap: str, topic: str, expected: int, within: float = 30.0) -> list:
    """Read a topic from the start until `expected` records arrived (or time ran out)."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    out: list = []
    try:
        deadline = time.monotonic() + within
        while len(out) < expected and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for recs in batch.values():
                out.extend(recs)
    finally:
        await consumer.stop()
    return out


async def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        if not parts:
            await consumer._client.force_metadata_update()
            parts = consumer.partitions_for_topic(topic) or set()
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in parts])
        return {tp.partition: off for tp, off in ends.items()}
    finally:
        await consumer.stop()


async def stream_coupons(
    bootstrap: str, topic: str, coupons: Sequence[CouponIssued], chunk: int, every_s: float
) -> None:
    """Produce `chunk` records every `every_s` seconds: traffic before, during and after a fault."""
    for i in range(0, len(coupons), chunk):
        await produce_coupons(bootstrap, topic, coupons[i : i + chunk])
        await asyncio.sleep(every_s)


async def assert_stored_once(
    engine: AsyncEngine, event_id: str, sent: Sequence[CouponIssued], bootstrap: str, dlq: str
) -> None:
    """Every sent coupon is a row, each once, nothing else is in the table or dead-lettered."""
    assert await codes(engine, event_id) == sorted(c.code for c in sent)
    async with engine.connect() as conn:
        n = (await conn.execute(text("SELECT COUNT(*) FROM user_coupons"))).scalar_one()
    assert n == len(sent)
    assert await read_all(bootstrap, dlq, 1, within=2) == []


async def drained(bootstrap: str, group: str, topic: str) -> bool:
    """The group has committed every partition of the topic up to its end."""
    return await committed(bootstrap, group, topic) == await end_offsets(bootstrap, topic)


def lags(topic: str) -> list[float]:
    """The persister's consumer-lag gauges for the topic (refreshed about once a second)."""
    return [
        s.value for m in metrics.LAG.collect() for s in m.samples if s.labels.get("topic") == topic
    ]


async def lag_zero(topic: str, partitions: int) -> bool:
    """Every partition's lag gauge is there and reads 0 (they refresh about once a second)."""
    values = lags(topic)
    return len(values) == partitions and all(v == 0 for v in values)


async def count_rows(engine: AsyncEngine, event_id: str) -> int:
    async with engine.connect() as conn:
        return (
            await conn.execute(
                select(func.count())
                .select_from(user_coupons)
                .where(user_coupons.c.event_id == event_id)
            )
        ).scalar_one()


async def codes(engine: AsyncEngine, event_id: str) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(user_coupons.c.code).where(user_coupons.c.event_id == event_id)
        )
        return sorted(r.code for r in rows)


def settings_for(
    bootstrap: str, url: str, topic: str, dlq: str, group: str, **kw: object
) -> PersisterSettings:
    defaults: dict[str, object] = {
        "max_batch": 500,
        "max_wait_ms": 50,
        "retry_backoff_base_s": 0.1,
        "retry_backoff_cap_s": 1.0,
        "db_pool_size": 4,
    }
    return PersisterSettings(
        kafka=KafkaSettings(bootstrap),
        mysql=MysqlSettings(url),
        topic=topic,
        dlq_topic=dlq,
        group_id=group,
        **{**defaults, **kw},  # type: ignore[arg-type]
    )


def engine_for(url: str) -> AsyncEngine:
    return create_async_engine(url, pool_size=2)


@dataclass
class FaultRig:
    """A private, migrated MariaDB with one event, and fresh topics on the shared Kafka."""

    db: PrivateServer
    url: str
    engine: AsyncEngine  # for checks after the fault; its pool is empty to begin with
    bootstrap: str
    topic: str
    dlq: str
    event: str
    group: str

    def settings(self, **kw: object) -> PersisterSettings:
        return settings_for(self.bootstrap, self.url, self.topic, self.dlq, self.group, **kw)

    async def stream(self, coupons: Sequence[CouponIssued], chunk: int, every_s: float) -> None:
        await stream_coupons(self.bootstrap, self.topic, coupons, chunk, every_s)

    async def wait_drained(self, within: float, partitions: int = 3) -> None:
        """Everything produced is committed, then every lag gauge reads 0."""
        assert await wait_until(lambda: drained(self.bootstrap, self.group, self.topic), within)
        assert await wait_until(lambda: lag_zero(self.topic, partitions), 10), lags(self.topic)

    async def assert_stored_once(self, sent: Sequence[CouponIssued]) -> None:
        await assert_stored_once(self.engine, self.event, sent, self.bootstrap, self.dlq)


@contextlib.asynccontextmanager
async def fault_rig(bootstrap: str, partitions: int = 3) -> AsyncIterator[FaultRig]:
    """Set up a FaultRig; on exit drop the topics and stop the private server."""
    db, url = private_mariadb()
    await asyncio.to_thread(db.start)
    topic = await create_topic(bootstrap, partitions)
    dlq = await create_topic(bootstrap, 1, prefix="dlq")
    engine = create_async_engine(url, pool_pre_ping=True)
    try:
        await asyncio.to_thread(upgrade, url)
        event = random_name("ev")
        await insert_event(engine, event)
        await engine.dispose()  # its pooled connections would not survive the fault anyway
        yield FaultRig(db, url, engine, bootstrap, topic, dlq, event, random_name("g"))
    finally:
        await engine.dispose()
        await delete_topics(bootstrap, topic, dlq)
        await asyncio.to_thread(db.stop)


@contextlib.asynccontextmanager
async def persister_http(settings: PersisterSettings) -> AsyncIterator[httpx.AsyncClient]:
    """The persister app with its lifespan running (the loop consumes), and a client to it."""
    async with app_client(create_app(settings), "http://p") as http:
        yield http


async def is_ready(http: httpx.AsyncClient) -> bool:
    return (await http.get("/readyz")).status_code == 200
