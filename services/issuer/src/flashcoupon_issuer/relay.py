"""The outbox relay: moves every event's outbox stream into Kafka, at least once.

Per event (found in keys.EVENTS_REGISTRY) one task reads the stream through the shared
consumer group keys.RELAY_GROUP, sends the records with the idempotent producer, and only
after Kafka acknowledged a record deletes and acknowledges its entry (XDEL, then XACK).

The subtle part is what "pending" means here. An entry read but not acknowledged sits in the
group's pending list under this relay's name. If this relay dies, another relay's XAUTOCLAIM
takes it over once it has been idle for claim_idle_ms; if this relay restarts under the same
name, it first re-reads its own pending entries (id 0). Either way the record may reach Kafka
twice — the persister's UNIQUE constraints make that harmless — but never zero times.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from aiokafka.partitioner import DefaultPartitioner
from flashcoupon_common import keys
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from flashcoupon_issuer.relay_metrics import RelayMetrics
from flashcoupon_issuer.relay_policy import (
    Outgoing,
    backoff_delay,
    by_partition,
    consumers_to_forget,
    entry_age_seconds,
    needs_new_producer,
    plan_batch,
    should_retire,
    split_results,
)
from flashcoupon_issuer.relay_producer import (
    ProducerFactory,
    ProducerHolder,
    default_producer_factory,
)
from flashcoupon_issuer.relay_settings import RelaySettings

logger = logging.getLogger(__name__)

GROUP = keys.RELAY_GROUP
# The producer's own default: murmur2 of the key, as the Java client does.
_PARTITIONER = DefaultPartitioner()
Entries = list[tuple[bytes, dict[bytes, bytes]]]


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


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
        self._producer = ProducerHolder(
            producer_factory or default_producer_factory(settings), self.metrics
        )
        self._stopping = asyncio.Event()
        self._deadline = float("inf")  # monotonic time after which in-flight work is abandoned
        self._registry: set[str] = set()
        self._streams: dict[str, asyncio.Task[None]] = {}

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Finish in-flight batches (for up to shutdown_grace_ms), then stop."""
        if not self._stopping.is_set():
            self._deadline = time.monotonic() + self.settings.shutdown_grace_ms / 1000
            self._stopping.set()

    async def run(self) -> None:
        s = self.settings
        next_metrics = 0.0
        try:
            while not self._stopping.is_set():
                try:
                    await self._discover()
                    if time.monotonic() >= next_metrics:
                        next_metrics = time.monotonic() + s.metrics_interval_ms / 1000
                        await self._collect_metrics()
                except Exception as exc:  # noqa: BLE001 - Redis away: keep the loop, retry later
                    logger.warning("relay housekeeping failed: %r", exc)
                await self._pause(s.registry_refresh_ms / 1000)
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
            logger.info("relay %s stopped", s.consumer)

    async def ready(self) -> dict[str, bool]:
        try:
            redis_ok = bool(await asyncio.wait_for(self._redis.ping(), 2))
        except Exception:  # noqa: BLE001 - unreachable for any reason means "not ready"
            redis_ok = False
        return {"redis": redis_ok, "kafka": await self._producer.ready()}

    def watched_events(self) -> set[str]:
        """Events whose outbox this relay currently relays."""
        return set(self._streams)

    async def _pause(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            pass

    def _abandon(self) -> bool:
        return self._stopping.is_set() and time.monotonic() >= self._deadline

    # ------------------------------------------------------------------ discovery

    async def _discover(self) -> None:
        members = await self._redis.smembers(keys.EVENTS_REGISTRY)
        self._registry = {_text(m) for m in members}
        if self.settings.events:
            self._registry &= set(self.settings.events)
        for event_id in sorted(self._registry - self._streams.keys()):
            task = asyncio.create_task(self._stream_loop(event_id), name=f"relay:{event_id}")
            self._streams[event_id] = task
            task.add_done_callback(lambda t, e=event_id: self._forget_stream(e, t))
            logger.info("relaying outbox of event %s", event_id)

    def _forget_stream(self, event_id: str, task: asyncio.Task[None]) -> None:
        if self._streams.get(event_id) is task:
            del self._streams[event_id]
        if not task.cancelled() and task.exception() is not None:
            logger.error("stream task of %s died: %r", event_id, task.exception())

    async def _ensure_group(self, key: str) -> None:
        try:
            # From id 0: entries written before any relay existed are relayed too.
            await self._redis.xgroup_create(key, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # ------------------------------------------------------------------ one stream

    async def _stream_loop(self, event_id: str) -> None:
        s = self.settings
        key = keys.outbox_key(event_id)
        group_ready = False
        own_pending = True  # at start and after any error: our own unacknowledged entries first
        next_claim = 0.0
        failures = 0
        while not self._stopping.is_set():
            try:
                if not group_ready:
                    # After an error the stream may have been deleted with its event (the
                    # finalizer's DEL comes just before its SREM): recreating the group would
                    # MKSTREAM an empty outbox of a deleted event that nothing ever removes.
                    if failures and await self._event_gone(event_id):
                        return
                    await self._ensure_group(key)
                    group_ready = True
                if own_pending:
                    await self._drain_own_pending(event_id, key)
                    own_pending = False
                if time.monotonic() >= next_claim:
                    next_claim = time.monotonic() + s.claim_interval_ms / 1000
                    await self._claim(event_id, key)
                entries = await self._read(key, ">", block=True)
                if entries:
                    await self._deliver(event_id, key, entries)
                elif event_id not in self._registry and await self._drained(key):
                    logger.info("event %s left the registry and its outbox is empty", event_id)
                    self.metrics.forget_event(event_id)
                    return
                failures = 0
            except ResponseError as exc:
                # NOGROUP: the stream was deleted between two calls; UNBLOCKED: while a blocking
                # XREADGROUP waited on it.
                gone = "NOGROUP" in str(exc) or "UNBLOCKED" in str(exc)
                if gone and await self._event_gone(event_id):
                    return
                group_ready = False
                failures = await self._after_error(event_id, exc, failures)
                own_pending = True
            except Exception as exc:  # noqa: BLE001 - Redis/Kafka trouble: back off, go on
                failures = await self._after_error(event_id, exc, failures)
                own_pending = True

    async def _event_gone(self, event_id: str) -> bool:
        """The stream or its group was deleted: stop for a deleted event; for a live one the
        caller recreates the group (from id 0, so nothing written meanwhile is skipped)."""
        try:
            live = await self._redis.sismember(keys.EVENTS_REGISTRY, event_id)
        except Exception:  # noqa: BLE001 - cannot tell: keep the stream and retry
            return False
        if not live:
            logger.info("outbox of event %s is gone", event_id)
            self.metrics.forget_event(event_id)
        return not live

    async def _after_error(self, event_id: str, exc: BaseException, failures: int) -> int:
        s = self.settings
        logger.warning("relaying %s failed (attempt %d): %r", event_id, failures + 1, exc)
        delay = backoff_delay(failures, base=s.backoff_base_ms / 1000, cap=s.backoff_max_ms / 1000)
        await self._pause(delay)
        return failures + 1

    async def _read(self, key: str, start: str, *, block: bool = False) -> Entries:
        s = self.settings
        response = await self._redis.xreadgroup(
            GROUP,
            s.consumer,
            {key: start},
            count=s.batch_size,
            block=s.block_ms if block else None,
        )
        for _stream, entries in response or []:
            return entries  # type: ignore[no-any-return]
        return []

    async def _drain_own_pending(self, event_id: str, key: str) -> None:
        """Entries this consumer name read before but never acknowledged (a restart)."""
        cursor = "0"
        while not self._stopping.is_set():
            entries = await self._read(key, cursor)
            if not entries:
                return
            logger.info("re-delivering %d own pending entries of %s", len(entries), event_id)
            await self._deliver(event_id, key, entries)
            cursor = _text(entries[-1][0])

    async def _claim(self, event_id: str, key: str) -> None:
        """Take over entries idle on other (dead) relays, then forget long-dead consumers."""
        s = self.settings
        start: bytes | str = "0-0"
        while not self._stopping.is_set():
            nxt, entries, _deleted = await self._redis.xautoclaim(
                key, GROUP, s.consumer, s.claim_idle_ms, start_id=start, count=s.batch_size
            )
            if entries:
                self.metrics.claimed.labels(event_id).inc(len(entries))
                logger.warning("claimed %d idle entries of %s", len(entries), event_id)
                await self._deliver(event_id, key, entries)
            if _text(nxt) == "0-0":
                break
            start = nxt
        consumers = await self._redis.xinfo_consumers(key, GROUP)
        for name in consumers_to_forget(consumers, me=s.consumer, idle_ms=s.forget_consumer_ms):
            # DELCONSUMER drops the consumer's pending entries; re-check they are none.
            pending = await self._redis.xpending_range(key, GROUP, "-", "+", 1, consumername=name)
            if not pending:
                await self._redis.xgroup_delconsumer(key, GROUP, name)
                logger.info("removed idle consumer %s from %s", name, key)

    async def _drained(self, key: str) -> bool:
        length = await self._redis.xlen(key)
        pending = (await self._redis.xpending(key, GROUP))["pending"]
        return should_retire(False, int(length), int(pending))

    # ------------------------------------------------------------------ delivery

    async def _deliver(self, event_id: str, key: str, entries: Sequence[Any]) -> None:
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
        attempt = 0
        held_since = time.monotonic()
        while pending:
            results, generation = await self._send(pending)
            done, again, error = split_results(pending, results)
            if done:
                await self._ack(key, [o.entry_id for o in done])
                letters = sum(o.dead_letter for o in done)
                if letters:
                    self.metrics.dead_lettered.labels(event_id).inc(letters)
                self.metrics.relayed.labels(event_id).inc(len(done) - letters)
            pending = again
            if not pending:
                return
            assert error is not None
            self.metrics.send_failures.labels(type(error).__name__).inc(len(pending))
            logger.warning(
                "kafka did not take %d records of %s (attempt %d): %r",
                len(pending),
                event_id,
                attempt + 1,
                error,
            )
            if generation is not None and needs_new_producer(error):
                await self._producer.recreate(generation, error)
            if self._abandon():
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
        """One attempt: every record's outcome (a metadata object or an exception).

        Records go out as one record batch per partition (create_batch/send_batch): one
        future per partition instead of one per record. A partition's batch succeeds or
        fails as a whole, and so do its records here.
        """
        s = self.settings
        try:
            producer, generation = await self._producer.get()
        except Exception as exc:  # noqa: BLE001 - Kafka unreachable: all records failed
            return [exc] * len(batch), None
        self.metrics.batch_size.observe(len(batch))
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
                    builder, members = producer.create_batch(), []
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
            self.metrics.ack_seconds.observe(loop.time() - started)
        return results, generation

    async def _ack(self, key: str, ids: list[str]) -> None:
        # XDEL before XACK: a crash in between leaves a deleted-but-pending id, which the next
        # reader sees with no fields and just acknowledges. The other order would leave an
        # acknowledged entry in the stream forever (never re-read, never deleted).
        async with self._redis.pipeline() as pipe:
            pipe.xdel(key, *ids)
            pipe.xack(key, GROUP, *ids)
            await pipe.execute()

    # ------------------------------------------------------------------ metrics

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
            age = entry_age_seconds(first[0][0], now_ms) if first else 0.0
            self.metrics.oldest_age.labels(event_id).set(age)
            oldest = summary["min"]
            pending_age = entry_age_seconds(oldest, now_ms) if oldest else 0.0
            self.metrics.oldest_pending_age.labels(event_id).set(pending_age)
