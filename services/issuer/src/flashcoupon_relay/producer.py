"""The relay's Kafka producer, shared by every stream it relays, and rebuilt when it goes bad.

aiokafka's idempotent producer retries retriable errors forever, but after a broker blip it can
end up refusing everything (OutOfOrderSequenceNumber, UnknownProducerId) or never answering.
The holder hands out the current producer with a generation number; a caller that saw a fatal
error asks to recreate *that* generation, so N streams failing at once rebuild it once.
Records the discarded producer never delivered stay pending in Redis and are sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaProducer

from flashcoupon_relay.metrics import RelayMetrics
from flashcoupon_relay.settings import RelaySettings

logger = logging.getLogger(__name__)

ProducerFactory = Callable[[], AIOKafkaProducer]


def default_producer_factory(settings: RelaySettings) -> ProducerFactory:
    def make() -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=settings.kafka.bootstrap,
            client_id=f"flashcoupon-relay-{settings.consumer}",
            # aiokafka's defaults (acks=1, no idempotence) lose records on a leader change.
            enable_idempotence=True,
            acks="all",
            linger_ms=settings.linger_ms,
            # Records are ~400 bytes; big batches mean fewer produce round trips, which is
            # what limits an idempotent producer (one in-flight request per partition).
            max_batch_size=512 * 1024,
            # Bounds send()'s wait for metadata while Kafka is away; delivery itself is
            # bounded by the relay's own delivery timeout.
            request_timeout_ms=min(settings.delivery_timeout_ms, 30_000),
        )

    return make


class ProducerHolder:
    def __init__(
        self, factory: ProducerFactory, metrics: RelayMetrics, *, stop_timeout: float = 5.0
    ) -> None:
        self._factory = factory
        self._metrics = metrics
        self._stop_timeout = stop_timeout
        self._producer: AIOKafkaProducer | None = None
        self._generation = 0
        self._lock = asyncio.Lock()

    async def get(self) -> tuple[AIOKafkaProducer, int]:
        """The current producer, started on first use; raises when Kafka cannot be reached."""
        if self._producer is not None:
            return self._producer, self._generation
        async with self._lock:
            if self._producer is None:
                producer = self._factory()
                try:
                    await producer.start()
                except BaseException:
                    await self._discard(producer)
                    raise
                self._producer = producer
                self._generation += 1
                logger.info("kafka producer %d started", self._generation)
            return self._producer, self._generation

    async def recreate(self, generation: int, reason: BaseException) -> None:
        """Discard producer `generation` (if still current); the next get() builds a new one."""
        async with self._lock:
            if self._producer is None or generation != self._generation:
                return
            old, self._producer = self._producer, None
            self._metrics.producer_recreations.inc()
        logger.warning("discarding kafka producer %d after %r", generation, reason)
        await self._discard(old)

    async def ready(self) -> bool:
        """Kafka reachable: some broker of the current producer accepts a connection."""
        try:
            producer, _ = await asyncio.wait_for(self.get(), 3)
            for broker in producer.client.cluster.brokers():
                if await asyncio.wait_for(producer.client.ready(broker.nodeId), 2):
                    return True
        except Exception as exc:  # noqa: BLE001 - any failure is "not ready"; logged at debug
            logger.debug("kafka not ready: %r", exc)
        return False

    async def close(self) -> None:
        """Flush and stop (graceful shutdown); bounded, since a dead broker never flushes."""
        async with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            await self._discard(producer)

    async def _discard(self, producer: AIOKafkaProducer) -> None:
        try:
            await asyncio.wait_for(producer.stop(), self._stop_timeout)
            return
        except Exception as exc:  # noqa: BLE001 - a producer being thrown away may fail any way
            logger.warning("kafka producer did not stop cleanly: %r", exc)
        # stop() waits for the accumulator to flush, forever if the broker is gone. Cut the
        # sender task loose and close the connections; its undelivered records are still
        # pending in Redis and will be sent by the next producer.
        sender_task = getattr(producer._sender, "sender_task", None)
        if sender_task is not None and not sender_task.done():
            sender_task.cancel()
            await asyncio.wait([sender_task], timeout=self._stop_timeout)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.client.close(), self._stop_timeout)
