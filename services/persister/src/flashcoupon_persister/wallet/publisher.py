"""Publishing `coupon-redeemed` after the redemption committed, without making it depend on Kafka.

The redemption is already durable in MySQL when we publish, so a Kafka outage must not turn it
into an error. Events go into a bounded in-memory queue; one background task sends them with an
idempotent producer and retries failures with capped backoff, recreating the producer when it
reports a non-retriable error (aiokafka's idempotent producer can wedge on
OutOfOrderSequenceNumber after a broker blip). Guarantee: at-least-once while the process lives;
events still queued when the process dies are lost (an outbox table would close that gap; see
docs/wallet.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from flashcoupon_common.messages import CouponRedeemed
from prometheus_client import Counter, Gauge

logger = logging.getLogger(__name__)

PUBLISHED = Counter(
    "flashcoupon_wallet_redeemed_published_total", "coupon-redeemed events acknowledged by Kafka"
)
PUBLISH_FAILURES = Counter(
    "flashcoupon_wallet_redeemed_publish_failures_total",
    "failed attempts to publish coupon-redeemed events (each is retried)",
)
DROPPED = Counter(
    "flashcoupon_wallet_redeemed_dropped_total",
    "coupon-redeemed events dropped because the pending queue was full or at shutdown",
)
PENDING = Gauge(
    "flashcoupon_wallet_redeemed_pending", "coupon-redeemed events waiting to reach Kafka"
)

_BATCH = 500


class RedeemedPublisher:
    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        producer: AIOKafkaProducer | None = None,
        max_pending: int = 100_000,
        retry_initial: float = 0.2,
        retry_max: float = 5.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self._producer = producer
        self._owns_producer = producer is None
        self._queue: asyncio.Queue[CouponRedeemed] = asyncio.Queue(max_pending)
        self._in_flight = 0
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()  # set while nothing is pending
        self._idle.set()

    @property
    def pending(self) -> int:
        return self._queue.qsize() + self._in_flight

    def publish(self, event: CouponRedeemed) -> None:
        """Queue an event; never blocks and never fails the caller."""
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            DROPPED.inc()
            logger.error(
                "coupon-redeemed queue full (%d); dropped event for coupon %s order %s",
                self._queue.maxsize,
                event.code,
                event.order_id,
            )
            return
        self._idle.clear()
        PENDING.inc()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="redeemed-publisher")

    async def stop(self, drain_seconds: float) -> None:
        """Give pending events up to drain_seconds to reach Kafka, then stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), drain_seconds)
        if self.pending:
            DROPPED.inc(self.pending)
            PENDING.dec(self.pending)
            logger.error("shutting down with %d coupon-redeemed events unpublished", self.pending)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._owns_producer and self._producer is not None:
            await self._close_producer()

    async def _run(self) -> None:
        backoff = self._retry_initial
        while True:
            batch = [await self._queue.get()]
            while len(batch) < _BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            self._in_flight = len(batch)
            while batch:
                try:
                    batch, error = await self._send(batch)
                except (KafkaError, OSError) as exc:
                    error = exc
                except Exception as exc:  # a bug must not end publishing
                    logger.exception("unexpected error publishing coupon-redeemed events")
                    error = exc
                self._in_flight = len(batch)
                if error is None:
                    backoff = self._retry_initial
                    continue
                PUBLISH_FAILURES.inc()
                logger.warning(
                    "publishing %d coupon-redeemed events failed (%r); retrying in %.1fs",
                    len(batch),
                    error,
                    backoff,
                )
                if self._owns_producer and not getattr(error, "retriable", False):
                    await self._close_producer()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._retry_max)
            if self._queue.empty():
                self._idle.set()

    async def _send(
        self, batch: list[CouponRedeemed]
    ) -> tuple[list[CouponRedeemed], BaseException | None]:
        """Send a batch; returns the events Kafka did not acknowledge and the first error.

        If send() itself raises part-way, the whole batch is retried: Kafka may then hold an
        event twice, which the coupon code lets consumers recognise.
        """
        producer = await self._ensure_producer()
        futures = [await producer.send(self.topic, e.encode(), key=e.kafka_key()) for e in batch]
        results = await asyncio.gather(*futures, return_exceptions=True)
        failed = [e for e, r in zip(batch, results, strict=True) if isinstance(r, BaseException)]
        done = len(batch) - len(failed)
        PUBLISHED.inc(done)
        PENDING.dec(done)
        error = next((r for r in results if isinstance(r, BaseException)), None)
        return failed, error

    async def _ensure_producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap,
                enable_idempotence=True,  # implies acks=all
                linger_ms=5,
                request_timeout_ms=10_000,
            )
            try:
                await producer.start()
            except BaseException:
                await producer.stop()
                raise
            self._producer = producer
        return self._producer

    async def _close_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(KafkaError, OSError):
                await producer.stop()
