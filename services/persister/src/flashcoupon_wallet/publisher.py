"""Publishing `coupon-redeemed` from the outbox table, so no acknowledged redemption loses it.

A redemption commits its message into `redeemed_outbox` together with the UPDATE
(`store.redeem`). One background task per wallet process drains the table: woken right after
such a commit (`wake()`) and polling every `poll_seconds` anyway, so that entries a dead replica
left behind are picked up by any live one. A pass claims a batch (`outbox.claim`: FOR UPDATE
SKIP LOCKED, so replicas never hold the same entry), sends it with an idempotent producer,
removes the entries Kafka acknowledged and commits. Failures are retried with capped backoff; a
non-retriable Kafka error gets a fresh producer (aiokafka's idempotent producer can wedge on
OutOfOrderSequenceNumber after a broker blip).

Guarantee: at-least-once across crashes. The duplicate window is "Kafka acknowledged, then the
removal did not commit" (process killed, MySQL gone, or send() failing or timing out mid-batch,
which rolls the pass back); the entry is then sent again. Memory holds one batch at most; on
shutdown, unsent entries simply stay in the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from flashcoupon_common import kafka_producer
from flashcoupon_common.backoff import backoff_delay
from flashcoupon_common.kafka_producer import (
    ProducerFactory,
    ProducerHolder,
    idempotent_producer_factory,
)
from prometheus_client import Counter, Gauge
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from flashcoupon_wallet import outbox
from flashcoupon_wallet.outbox import OutboxEntry

logger = logging.getLogger(__name__)

BACKLOG_COUNT_CAP = 100_000

PUBLISHED = Counter(
    "flashcoupon_wallet_redeemed_published_total",
    "coupon-redeemed events acknowledged by Kafka and removed from the outbox",
)
PUBLISH_FAILURES = Counter(
    "flashcoupon_wallet_redeemed_publish_failures_total",
    "failed passes over the coupon-redeemed outbox (Kafka or MySQL; each is retried)",
)
PENDING = Gauge(
    "flashcoupon_wallet_redeemed_outbox_length",
    f"entries in the coupon-redeemed outbox table, counted up to {BACKLOG_COUNT_CAP}",
)
OLDEST = Gauge(
    "flashcoupon_wallet_redeemed_outbox_oldest_age_seconds",
    "age of the oldest entry in the coupon-redeemed outbox table (0 when empty)",
)


def split_acked(
    entries: Sequence[OutboxEntry], results: Sequence[object]
) -> tuple[list[int], BaseException | None]:
    """(ids Kafka acknowledged, the first error); a result is an exception or record metadata."""
    pairs = zip(entries, results, strict=True)
    acked = [e.id for e, r in pairs if not isinstance(r, BaseException)]
    error = next((r for r in results if isinstance(r, BaseException)), None)
    return acked, error


def needs_new_producer(error: BaseException) -> bool:
    """A database error says nothing about the producer; any other error is judged by the
    library's rule (kafka_producer.needs_new_producer)."""
    if isinstance(error, SQLAlchemyError):
        return False
    return kafka_producer.needs_new_producer(error)


def next_wait(
    claimed: int,
    batch_size: int,
    failures: int,
    *,
    poll: float,
    retry_initial: float,
    retry_max: float,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds until the next pass: the shared backoff after failed passes, none after a full
    batch (more is probably waiting), else the poll interval (a wake() cuts it short)."""
    if failures:
        return backoff_delay(failures - 1, base=retry_initial, cap=retry_max, rand=rand)
    if claimed >= batch_size:
        return 0.0
    return poll


class RedeemedPublisher:
    def __init__(
        self,
        engine: AsyncEngine,
        bootstrap: str,
        topic: str,
        *,
        producer_factory: ProducerFactory | None = None,
        batch_size: int = 500,
        poll_seconds: float = 1.0,
        retry_initial: float = 0.2,
        retry_max: float = 5.0,
        send_timeout: float = 15.0,
    ) -> None:
        self.topic = topic
        self._engine = engine
        self._producer = ProducerHolder(
            producer_factory or idempotent_producer_factory(bootstrap, request_timeout_ms=10_000)
        )
        self._batch_size = batch_size
        self._poll = poll_seconds
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._send_timeout = send_timeout
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()

    def wake(self) -> None:
        """An outbox entry was just committed: start a pass now rather than at the next poll."""
        self._wake.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="redeemed-publisher")

    async def stop(self, grace_seconds: float) -> None:
        """Let the batch in flight finish for up to grace_seconds, then stop.

        Nothing is lost either way: what was not acknowledged and removed stays in the table
        for the next pass of any replica (a cancelled batch rolls back its removals).
        """
        self._stop.set()
        self._wake.set()
        if self._task is not None:
            await asyncio.wait([self._task], timeout=grace_seconds)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._producer.close()
        logger.info("coupon-redeemed publisher stopped; unsent entries stay in the outbox")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        generation = 0  # of the producer the last pass used
        backlog_due = 0.0
        while not self._stop.is_set():
            self._wake.clear()
            claimed = 0
            try:
                producer, generation = await self._producer.get()
                claimed = await self._publish_batch(producer)
                failures = 0
            except Exception as exc:  # noqa: BLE001 - every failure is retried; logged below
                failures += 1
                self._on_failure(exc)
                if needs_new_producer(exc):
                    await self._producer.recreate(generation, exc)
            if loop.time() >= backlog_due:
                backlog_due = loop.time() + self._poll
                await self._refresh_backlog()
            delay = next_wait(
                claimed,
                self._batch_size,
                failures,
                poll=self._poll,
                retry_initial=self._retry_initial,
                retry_max=self._retry_max,
            )
            # After a failure only stop() interrupts the backoff; otherwise a wake() does.
            event = self._stop if failures else self._wake
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), delay)

    def _on_failure(self, exc: Exception) -> None:
        PUBLISH_FAILURES.inc()
        if isinstance(exc, KafkaError | OSError | TimeoutError | SQLAlchemyError):
            logger.warning("publishing coupon-redeemed events failed (%r); will retry", exc)
        else:  # a bug must not end publishing, but it must be seen
            logger.exception("unexpected error publishing coupon-redeemed events")

    async def _publish_batch(self, producer: AIOKafkaProducer) -> int:
        """One pass: claim, send, remove what Kafka acknowledged; the number of entries claimed.

        Raises the first send error after committing the removals of the acknowledged entries.
        """
        async with outbox.claim(self._engine, self._batch_size) as batch:
            if not batch.entries:
                return 0
            results = await asyncio.wait_for(
                self._send(producer, batch.entries), self._send_timeout
            )
            acked, error = split_acked(batch.entries, results)
            await batch.remove(acked)
        PUBLISHED.inc(len(acked))
        if error is not None:
            raise error
        return len(batch.entries)

    async def _send(
        self, producer: AIOKafkaProducer, entries: Sequence[OutboxEntry]
    ) -> list[object]:
        """If send() itself raises part-way, the claim rolls back and the whole batch is sent
        again: Kafka may then hold an event twice, which `code` lets consumers recognise."""
        futures = [await producer.send(self.topic, e.payload, key=e.key) for e in entries]
        return list(await asyncio.gather(*futures, return_exceptions=True))

    async def _refresh_backlog(self) -> None:
        try:
            count, age = await outbox.backlog(self._engine, BACKLOG_COUNT_CAP)
        except SQLAlchemyError as exc:  # MySQL away: the claim's failure is already logged
            logger.debug("outbox backlog not measured: %r", exc)
            return
        except Exception:  # a bug here must not end publishing
            logger.exception("measuring the coupon-redeemed outbox failed")
            return
        PENDING.set(count)
        OLDEST.set(age)
