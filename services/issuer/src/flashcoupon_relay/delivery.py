"""Delivery of outbox entries to Kafka, and their acknowledgement in Redis once Kafka has them.

The rule that keeps the outbox at-least-once: an entry is deleted and acknowledged (XDEL, then
XACK) only after Kafka acknowledged its record. Records go out as one record batch per partition
(create_batch/send_batch): one future per partition instead of one per record; a partition's
batch succeeds or fails as a whole, and so do its records here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from aiokafka.partitioner import DefaultPartitioner
from flashcoupon_common import keys, tracing
from flashcoupon_common.backoff import backoff_delay
from flashcoupon_common.kafka_producer import ProducerHolder, needs_new_producer
from redis.asyncio.cluster import RedisCluster

from flashcoupon_relay.metrics import RelayMetrics
from flashcoupon_relay.policy import (
    Outgoing,
    by_partition,
    plan_batch,
    split_results,
)
from flashcoupon_relay.settings import RelaySettings
from flashcoupon_relay.shutdown import Shutdown

logger = logging.getLogger(__name__)

GROUP = keys.RELAY_GROUP
# The producer's own default: murmur2 of the key, as the Java client does.
_PARTITIONER = DefaultPartitioner()


class Delivery:
    def __init__(
        self,
        settings: RelaySettings,
        redis: RedisCluster,
        producer: ProducerHolder,
        metrics: RelayMetrics,
        shutdown: Shutdown,
    ) -> None:
        self.settings = settings
        self._redis = redis
        self._producer = producer
        self._metrics = metrics
        self._shutdown = shutdown

    async def deliver(self, event_id: str, key: str, entries: Sequence[Any]) -> None:
        """Send until Kafka acknowledged every record, acknowledging entries as they land.

        Returns early only when shutting down past the grace period: what is left stays
        pending and is claimed by another relay (or by this name after a restart).
        """
        s = self.settings
        plan = plan_batch(key, event_id, entries, topic=s.topic, dlq_topic=s.dlq_topic)
        for entry_id, reason in plan.poison:
            logger.error(
                "outbox entry %s of %s is undecodable, dead-lettering: %s",
                entry_id,
                event_id,
                reason,
            )
        if plan.gone:
            await self._ack(key, plan.gone)
        pending = plan.outgoing
        spans = publish_spans(pending, s.topic) if tracing.ENABLED else None
        try:
            await self._deliver(event_id, key, pending, spans)
        finally:
            for span in (spans or {}).values():  # not acknowledged: shutdown or an error
                span.set_attribute("flashcoupon.delivered", False)
                span.end()

    async def _deliver(
        self, event_id: str, key: str, pending: list[Outgoing], spans: dict[str, Any] | None
    ) -> None:
        s = self.settings
        attempt = 0
        held_since = time.monotonic()
        while pending:
            results, generation = await self._send(pending)
            done, again, error = split_results(pending, results)
            if done:
                await self._ack(key, [o.entry_id for o in done])
                if spans:
                    for o in done:
                        span = spans.pop(o.entry_id, None)
                        if span is not None:
                            span.end()
                letters = sum(o.dead_letter for o in done)
                if letters:
                    self._metrics.dead_lettered.labels(event_id).inc(letters)
                self._metrics.relayed.labels(event_id).inc(len(done) - letters)
            pending = again
            if not pending:
                return
            assert error is not None
            self._metrics.send_failures.labels(type(error).__name__).inc(len(pending))
            logger.warning(
                "kafka did not take %d records of %s (attempt %d): %r",
                len(pending),
                event_id,
                attempt + 1,
                error,
            )
            if generation is not None and needs_new_producer(error):
                await self._producer.recreate(generation, error)
            if self._shutdown.abandon():
                logger.warning(
                    "shutting down with %d records of %s unsent; they stay pending",
                    len(pending),
                    event_id,
                )
                return
            delay = backoff_delay(
                attempt, base=s.backoff_base_ms / 1000, cap=s.backoff_max_ms / 1000
            )
            await asyncio.sleep(delay)
            attempt += 1
            if time.monotonic() - held_since > s.claim_idle_ms / 2000:
                # Still ours: reset the idle time so live relays do not claim what we retry.
                held_since = time.monotonic()
                await self._redis.xclaim(
                    key, GROUP, s.consumer, 0, [o.entry_id for o in pending], justid=True
                )

    async def _send(self, batch: list[Outgoing]) -> tuple[list[Any], int | None]:
        """One attempt: every record's outcome (a metadata object or an exception)."""
        s = self.settings
        try:
            producer, generation = await self._producer.get()
        except Exception as exc:  # noqa: BLE001 - Kafka unreachable: all records failed
            return [exc] * len(batch), None
        self._metrics.batch_size.observe(len(batch))
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + s.delivery_timeout_ms / 1000
        owner: list[asyncio.Future[Any] | None] = [None] * len(batch)
        futures: list[asyncio.Future[Any]] = []
        error: BaseException = TimeoutError(f"no Kafka ack within {s.delivery_timeout_ms} ms")

        async def submit(builder: Any, topic: str, partition: int, members: list[int]) -> None:
            future = await producer.send_batch(builder, topic, partition=partition)
            futures.append(future)
            for i in members:
                owner[i] = future

        try:
            async with asyncio.timeout_at(deadline):
                partitions = {
                    t: sorted(await producer.partitions_for(t)) for t in {o.topic for o in batch}
                }
                groups = by_partition(batch, partitions, _PARTITIONER)
                for (topic, partition), indices in groups.items():
                    builder, members = producer.create_batch(), list[int]()
                    for i in indices:
                        o = batch[i]
                        added = builder.append(
                            timestamp=None, key=o.key, value=o.value, headers=o.headers
                        )
                        if added is None:  # builder full: submit it, start another
                            await submit(builder, topic, partition, members)
                            builder, members = producer.create_batch(), []
                            builder.append(
                                timestamp=None, key=o.key, value=o.value, headers=o.headers
                            )
                        members.append(i)
                    await submit(builder, topic, partition, members)
        except Exception as exc:  # noqa: BLE001 - refused (no metadata, closed, ...)
            error = exc
        if futures:
            # asyncio.wait, not gather: a timeout must not cancel batches already handed over.
            await asyncio.wait(futures, timeout=max(0.0, deadline - loop.time()))
        results: list[Any] = []
        for f in owner:
            if f is None or not f.done() or f.cancelled():
                results.append(error)
            else:
                results.append(f.exception() or f.result())
        if all(f is not None and f.done() for f in owner):
            self._metrics.ack_seconds.observe(loop.time() - started)
        return results, generation

    async def _ack(self, key: str, ids: list[str]) -> None:
        # XDEL before XACK: a crash in between leaves a deleted-but-pending id, which the next
        # reader sees with no fields and just acknowledges. The other order would leave an
        # acknowledged entry in the stream forever (never re-read, never deleted).
        async with self._redis.pipeline() as pipe:
            pipe.xdel(key, *ids)
            pipe.xack(key, GROUP, *ids)
            await pipe.execute()


def publish_spans(batch: list[Outgoing], topic: str) -> dict[str, Any]:
    """One producer span per record that carries a traceparent (the issuer's span, from the
    outbox entry's `tp`): its header is replaced by the span's own, so the persister's span
    becomes its child. Each span ends when Kafka acknowledged the record."""
    spans: dict[str, Any] = {}
    for o in batch:
        if o.dead_letter or not o.headers or o.headers[0][0] != "traceparent":
            continue
        span = tracing.start(
            f"publish {topic}",
            o.headers[0][1],
            kind=tracing.PRODUCER,
            attributes={
                "messaging.system": "kafka",
                "messaging.destination.name": topic,
                "flashcoupon.outbox_id": o.entry_id,
                "flashcoupon.event_id": _header(o.headers, "event-id"),
            },
        )
        o.headers[0] = ("traceparent", tracing.traceparent_of(span).encode())
        spans[o.entry_id] = span
    return spans


def _header(headers: list[tuple[str, bytes]], name: str) -> str:
    value = tracing.header(headers, name)
    return value.decode("utf-8", "replace") if value is not None else ""
