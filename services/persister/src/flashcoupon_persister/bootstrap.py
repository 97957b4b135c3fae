"""Composition root: builds the engine, consumer, DLQ producer and the loop, and owns them.

`running()` is what the HTTP lifespan enters, and what tests and the benchmark enter directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from aiokafka import AIOKafkaConsumer
from flashcoupon_common.db.engine import create_engine
from flashcoupon_common.kafka_producer import ProducerFactory
from sqlalchemy.ext.asyncio import AsyncEngine

from .consumer import PersistLoop
from .dlq import DeadLetters
from .settings import PersisterSettings
from .writer import BatchWriter

logger = logging.getLogger(__name__)


def create_consumer(settings: PersisterSettings) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=settings.kafka.bootstrap,
        group_id=settings.group_id,
        enable_auto_commit=False,  # commits follow DB commits, see consumer.py
        auto_offset_reset="earliest",  # a new group must not skip coupons already issued
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_wait_ms=settings.max_wait_ms,
    )


@contextlib.asynccontextmanager
async def running(
    settings: PersisterSettings,
    *,
    engine: AsyncEngine | None = None,
    consumer: AIOKafkaConsumer | None = None,
    producer_factory: ProducerFactory | None = None,
    on_fatal: Callable[[BaseException], None] | None = None,
) -> AsyncIterator[PersistLoop]:
    """Start the persister; on exit finish the batch, commit, and leave the group."""
    own_engine = engine is None
    if engine is None:
        timeout = settings.db_write_timeout_s
        engine = create_engine(
            settings.mysql,
            pool_size=settings.db_pool_size,
            connect_timeout_s=timeout,
            pool_timeout_s=timeout,
        )
    own_consumer = consumer is None
    if consumer is None:
        consumer = create_consumer(settings)
    dead_letters = DeadLetters(
        settings.kafka.bootstrap,
        settings.dlq_topic,
        settings.group_id,
        producer_factory=producer_factory,
    )
    loop = PersistLoop(
        settings, consumer, BatchWriter(engine, timeout_s=settings.db_write_timeout_s), dead_letters
    )
    task: asyncio.Task[None] | None = None
    try:
        await dead_letters.start()
        if own_consumer:
            await consumer.start()
        task = asyncio.create_task(loop.run(), name="persister-loop")

        def _done(t: asyncio.Task[None]) -> None:
            if not t.cancelled() and t.exception() is not None:
                logger.error("persister loop died", exc_info=t.exception())
                if on_fatal is not None:
                    on_fatal(t.exception())  # type: ignore[arg-type]

        task.add_done_callback(_done)
        yield loop
    finally:
        loop.stop()
        if task is not None:
            with contextlib.suppress(Exception):
                await task
        if own_consumer:
            await consumer.stop()  # leaves the group: partitions move at once, not on timeout
        await dead_letters.stop()
        if own_engine:
            await engine.dispose()
