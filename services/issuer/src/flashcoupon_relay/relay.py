"""The outbox relay: moves every event's outbox stream into Kafka, at least once.

Per event (found in keys.EVENTS_REGISTRY) one task runs an OutboxStream (stream.py) that reads
through the shared consumer group keys.RELAY_GROUP and hands entries to the Delivery
(delivery.py), which acknowledges them only after Kafka did. This module owns what spans the
streams: discovering events, one producer for all of them, outbox metrics, and stopping.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

from flashcoupon_common import keys
from flashcoupon_common.kafka_producer import ProducerFactory, ProducerHolder
from flashcoupon_common.probes import redis_probe
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from flashcoupon_relay.delivery import GROUP, Delivery
from flashcoupon_relay.metrics import RelayMetrics
from flashcoupon_relay.policy import entry_age_seconds
from flashcoupon_relay.producer import relay_producer_factory
from flashcoupon_relay.settings import RelaySettings
from flashcoupon_relay.shutdown import Shutdown
from flashcoupon_relay.stream import OutboxStream, text

logger = logging.getLogger(__name__)


class Relay:
    def __init__(
        self,
        settings: RelaySettings,
        redis: RedisCluster,
        *,
        producer_factory: ProducerFactory | None = None,
        metrics: RelayMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or RelayMetrics()
        self._redis = redis
        self._redis_probe = redis_probe(redis)
        self._producer = ProducerHolder(
            producer_factory or relay_producer_factory(settings),
            on_recreate=self.metrics.producer_recreations.inc,
        )
        self._shutdown = Shutdown()
        self._delivery = Delivery(settings, redis, self._producer, self.metrics, self._shutdown)
        self._registry: set[str] = set()
        self._streams: dict[str, asyncio.Task[None]] = {}

    def stop(self) -> None:
        """Finish in-flight batches (for up to shutdown_grace_ms), then stop."""
        self._shutdown.begin(self.settings.shutdown_grace_ms / 1000)

    async def run(self) -> None:
        s = self.settings
        next_metrics = 0.0
        try:
            while not self._shutdown.requested:
                try:
                    await self._discover()
                    if time.monotonic() >= next_metrics:
                        next_metrics = time.monotonic() + s.metrics_interval_ms / 1000
                        await self._collect_metrics()
                except Exception as exc:  # noqa: BLE001 - Redis away: keep the loop, retry later
                    logger.warning("relay housekeeping failed: %r", exc)
                await self._shutdown.pause(s.registry_refresh_ms / 1000)
        finally:
            tasks = list(self._streams.values())
            if tasks:
                grace = s.shutdown_grace_ms / 1000 + s.block_ms / 1000 + 1
                _, late = await asyncio.wait(tasks, timeout=grace)
                for task in late:
                    task.cancel()
                if late:
                    await asyncio.wait(late, timeout=2)
            await self._producer.close()
            await self._redis_probe.close()
            logger.info("relay %s stopped", s.consumer)

    async def ready(self) -> dict[str, bool]:
        # Bounded without cancelling the PING: a wait_for around a redis-py call can lose the
        # cancellation and wait forever (flashcoupon_common.probes).
        redis_ok = await self._redis_probe.passes()
        return {"redis": redis_ok, "kafka": await self._producer.ready()}

    def watched_events(self) -> set[str]:
        """Events whose outbox this relay currently relays."""
        return set(self._streams)

    async def _discover(self) -> None:
        members = await self._redis.smembers(keys.EVENTS_REGISTRY)
        self._registry = {text(m) for m in members}
        if self.settings.events:
            self._registry &= set(self.settings.events)
        for event_id in sorted(self._registry - self._streams.keys()):
            stream = OutboxStream(
                event_id,
                self.settings,
                self._redis,
                self._delivery,
                self.metrics,
                self._shutdown,
                registered=self._registered,
            )
            task = asyncio.create_task(stream.run(), name=f"relay:{event_id}")
            self._streams[event_id] = task
            task.add_done_callback(functools.partial(self._forget_stream, event_id))
            logger.info("relaying outbox of event %s", event_id)

    def _registered(self, event_id: str) -> bool:
        """Whether the event was in the registry at the last discovery."""
        return event_id in self._registry

    def _forget_stream(self, event_id: str, task: asyncio.Task[None]) -> None:
        if self._streams.get(event_id) is task:
            del self._streams[event_id]
        if not task.cancelled() and task.exception() is not None:
            logger.error("stream task of %s died: %r", event_id, task.exception())

    async def _collect_metrics(self) -> None:
        now_ms = int(time.time() * 1000)
        for event_id in list(self._streams):
            key = keys.outbox_key(event_id)
            length = await self._redis.xlen(key)
            first = await self._redis.xrange(key, "-", "+", count=1)
            try:
                summary = await self._redis.xpending(key, GROUP)
            except ResponseError:  # no group yet
                summary = {"pending": 0, "min": None}
            self.metrics.outbox_length.labels(event_id).set(length)
            self.metrics.outbox_pending.labels(event_id).set(summary["pending"])
            first_id: bytes | str | None = first[0][0] if first else None
            age = entry_age_seconds(first_id, now_ms) if first_id else 0.0
            self.metrics.oldest_age.labels(event_id).set(age)
            oldest: bytes | str | None = summary["min"]
            pending_age = entry_age_seconds(oldest, now_ms) if oldest else 0.0
            self.metrics.oldest_pending_age.labels(event_id).set(pending_age)
