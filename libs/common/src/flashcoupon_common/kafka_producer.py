"""Kafka producers: how flashcoupon builds one, and the holder that rebuilds it when it goes bad.

aiokafka's defaults (acks=1, no idempotence) lose records on a leader change, so every producer
here is idempotent (which forces acks=all). An idempotent producer can still end up refusing
everything after a broker blip (OutOfOrderSequenceNumber, UnknownProducerId) or never
answering. The holder hands out the current producer with a generation number; a caller that
saw a fatal error asks to recreate *that* generation, so N callers failing at once rebuild it
once. Whatever the discarded producer never delivered must still be held by the caller (an
outbox row, a pending stream entry, an uncommitted offset) and be sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors

logger = logging.getLogger(__name__)

ProducerFactory = Callable[[], AIOKafkaProducer]


def idempotent_producer_factory(
    bootstrap: str,
    *,
    client_id: str | None = None,
    linger_ms: int = 5,
    request_timeout_ms: int = 15_000,
    max_batch_size: int = 16_384,
) -> ProducerFactory:
    """A factory of idempotent (acks=all) producers; `request_timeout_ms` bounds send()'s wait
    for metadata while Kafka is away."""

    def make() -> AIOKafkaProducer:
        kwargs = {"client_id": client_id} if client_id else {}
        return AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=True,
            acks="all",
            linger_ms=linger_ms,
            request_timeout_ms=request_timeout_ms,
            max_batch_size=max_batch_size,
            **kwargs,
        )

    return make


# Errors after which an idempotent producer cannot be trusted to make progress: its sequence
# numbers or epoch no longer match the broker's (the known aiokafka hang after a broker blip).
_FATAL = (
    kafka_errors.OutOfOrderSequenceNumber,
    kafka_errors.ProducerFenced,
    kafka_errors.UnknownProducerId,
    kafka_errors.InvalidProducerEpoch,
    kafka_errors.ProducerClosed,
    kafka_errors.IllegalStateError,
)


def needs_new_producer(exc: BaseException) -> bool:
    """Recreate the producer, or just retry with the same one?

    Retriable Kafka errors (no leader, connection refused, ...) are retried by the same
    producer. Everything else — fatal producer states, non-retriable errors, our own delivery
    timeout (a producer that did not answer in time may be stuck) — gets a fresh producer.
    """
    if isinstance(exc, _FATAL):
        return True
    if isinstance(exc, kafka_errors.KafkaError):
        return not exc.retriable
    return True


class ProducerHolder:
    def __init__(
        self,
        factory: ProducerFactory,
        *,
        on_recreate: Callable[[], None] | None = None,
        stop_timeout: float = 5.0,
    ) -> None:
        self._factory = factory
        self._on_recreate = on_recreate
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
            if self._on_recreate is not None:
                self._on_recreate()
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
        # sender task loose and close the connections; its undelivered records are still held
        # by the caller and will be sent by the next producer.
        sender_task = getattr(producer._sender, "sender_task", None)
        if sender_task is not None and not sender_task.done():
            sender_task.cancel()
            await asyncio.wait([sender_task], timeout=self._stop_timeout)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.client.close(), self._stop_timeout)
