"""The consume → write → commit loop (aiokafka, manual commits).

Guarantees: offsets are committed only after the batch's DB transaction committed and its dead
letters were acknowledged, so every record is stored (or dead-lettered) at least once; the
UNIQUE constraints turn "at least once" into one row per coupon.

Up to `write_concurrency` batches are written at once (separate connections: the database
overlaps their I/O, and decoding overlaps the writes), but their dead letters and offset
commits happen strictly in fetch order, so a commit never covers an unfinished batch.

While a transient failure lasts, the assigned partitions are paused and the loop keeps
polling (which returns nothing for paused partitions) between retries: the consumer stays in
its group (max.poll.interval) and holds no more than the batches already in flight. A
database that stops answering becomes such a failure too: the writer's timeout turns the hang
into WriteTimeout.

Over 300 lines on purpose: most of it is `PersistLoop`, whose fetch, concurrent writes,
in-order dead-lettering and commits, pausing and stopping share the in-flight queue; the pure
parts (`decode_all`, `is_stalled`) are small, and DLQ and writes live in their own modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeAlias, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord
from flashcoupon_common import tracing
from flashcoupon_common.backoff import backoff_delay
from flashcoupon_common.messages import CouponIssued, SchemaError

from . import metrics
from .dlq import DeadLetter, DeadLetters, DeadLetterSendError
from .settings import PersisterSettings
from .spans import write_spans
from .writer import BatchWriter, TransientWriteError, WriteTimeout

logger = logging.getLogger(__name__)

T = TypeVar("T")
Record: TypeAlias = ConsumerRecord[bytes, bytes]

# How long a batch may keep failing before readiness says so: longer than a deadlock retry or
# a short blip (a few backoff rounds), shorter than an operator would want to wait.
STALL_GRACE_S = 10.0


class Stopped(Exception):
    """Shutdown was asked for while a batch was waiting on a transient failure."""


def is_stalled(failing_since: float | None, now: float, grace_s: float = STALL_GRACE_S) -> bool:
    """Whether batches have been failing without a break for longer than grace_s."""
    return failing_since is not None and now - failing_since > grace_s


def decode_all(records: list[Record]) -> tuple[list[CouponIssued], list[Record], list[DeadLetter]]:
    """Decode a batch; what cannot be decoded becomes a dead letter right away."""
    coupons: list[CouponIssued] = []
    origins: list[Record] = []
    dead: list[DeadLetter] = []
    for r in records:
        try:
            if r.value is None:
                raise SchemaError("record has no value (tombstone)")
            coupons.append(CouponIssued.decode(r.value))
            origins.append(r)
        except SchemaError as exc:
            dead.append(DeadLetter(r, "schema", "SCHEMA_ERROR", str(exc)))
    return coupons, origins, dead


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, loop: PersistLoop) -> None:
        self.loop = loop

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        # Commit what is stored but not yet committed before another member takes over.
        await self.loop.commit_pending(set(revoked))
        for tp in revoked:
            try:
                metrics.LAG.remove(tp.topic, str(tp.partition))
            except KeyError:
                pass

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        logger.info("assigned %s", sorted(f"{tp.topic}/{tp.partition}" for tp in assigned))


@dataclass
class _InFlight:
    batches: dict[TopicPartition, list[Record]]
    task: asyncio.Task[list[DeadLetter]]


class PersistLoop:
    def __init__(
        self,
        settings: PersisterSettings,
        consumer: AIOKafkaConsumer,
        writer: BatchWriter,
        dead_letters: DeadLetters,
    ) -> None:
        self.settings = settings
        self.consumer = consumer
        self.writer = writer
        self.dead_letters = dead_letters
        self._stopping = asyncio.Event()
        self._pending: dict[TopicPartition, int] = {}  # stored, not yet committed
        self._inflight: deque[_InFlight] = deque()
        self._retrying = 0  # batches currently waiting out a transient failure
        self._failing_since: float | None = None  # monotonic; since _retrying became > 0
        self._paused = False
        self._lag_updated = 0.0
        self.batches_done = 0

    def stop(self) -> None:
        """Finish the batches in flight (if they can finish), commit, and return from run()."""
        self._stopping.set()

    @property
    def assigned(self) -> bool:
        return bool(self.consumer.assignment())

    @property
    def stalled(self) -> bool:
        """True while writes have kept failing for longer than STALL_GRACE_S (readiness)."""
        return is_stalled(self._failing_since, time.monotonic())

    async def run(self) -> None:
        self.consumer.subscribe([self.settings.topic], listener=_Rebalance(self))
        try:
            while not self._stopping.is_set():
                if self._retrying:
                    await self._poll_paused()
                elif len(self._inflight) >= self.settings.write_concurrency:
                    await asyncio.wait({self._inflight[0].task}, timeout=1.0)
                else:
                    await self._fetch()
                await self._finish_done()
                await self._update_lag()
        except Stopped:
            # A batch could not finish (its write or dead letters wait on a failure): nothing
            # fetched after it may be committed, or its records would be skipped.
            await self._drain(committing=False)
        else:
            await self._drain(committing=True)
        await self.commit_pending(None)

    async def _fetch(self) -> None:
        if self._paused:
            self.consumer.resume(*self.consumer.assignment())
            self._paused = False
            metrics.PAUSED.set(0)
        batches = await self.consumer.getmany(
            timeout_ms=self.settings.max_wait_ms, max_records=self.settings.max_batch
        )
        if batches:
            task = asyncio.create_task(self._store(batches))
            self._inflight.append(_InFlight(batches, task))

    async def _poll_paused(self) -> None:
        """Take no new records while a batch retries, but keep polling: the group keeps us."""
        # Re-pause each round: a rebalance may have handed us fresh, unpaused partitions.
        self.consumer.pause(*self.consumer.assignment())
        self._paused = True
        metrics.PAUSED.set(1)
        stray = await self.consumer.getmany(timeout_ms=200)
        for tp, recs in stray.items():
            # Never buffer beyond the batches in flight: rewind and fetch these later.
            self.consumer.seek(tp, recs[0].offset)

    async def _finish_done(self) -> None:
        """Dead-letter and commit finished batches, strictly in the order they were fetched."""
        while self._inflight and self._inflight[0].task.done():
            done = self._inflight.popleft()
            await self._finish(done.batches, done.task.result())  # Stopped propagates

    async def _drain(self, *, committing: bool) -> None:
        """At shutdown: complete what is in flight; commit only an unbroken prefix."""
        if not committing:
            logger.info("stopping with unfinished batches; they will be redelivered")
        while self._inflight:
            done = self._inflight.popleft()
            try:
                dead = await done.task
                if committing:
                    await self._finish(done.batches, dead)
            except Stopped:
                if committing:
                    logger.info("stopping with unfinished batches; they will be redelivered")
                committing = False

    async def _store(self, batches: dict[TopicPartition, list[Record]]) -> list[DeadLetter]:
        """Decode and write one batch (retrying transient failures); return its dead letters."""
        records = [r for recs in batches.values() for r in recs]
        coupons, origins, dead = decode_all(records)
        if coupons:
            spans = write_spans(origins, coupons) if tracing.ENABLED else None
            started = time.perf_counter()
            try:
                result = await self._retry("db", lambda: self.writer.write(coupons))
            finally:
                for span in spans or ():
                    span.end()
            metrics.DB_WRITE_SECONDS.observe(time.perf_counter() - started)
            metrics.BATCHES.inc()
            metrics.BATCH_SIZE.observe(len(coupons))
            metrics.ROWS.labels("inserted").inc(result.inserted)
            metrics.ROWS.labels("duplicate").inc(result.duplicates)
            dead.extend(
                DeadLetter(origins[x.index], x.reason, x.code, x.detail) for x in result.rejected
            )
        return dead

    async def _finish(
        self, batches: dict[TopicPartition, list[Record]], dead: list[DeadLetter]
    ) -> None:
        if dead:
            for d in dead:
                logger.warning(
                    "dead-lettering %s/%d@%d: %s %s",
                    d.record.topic,
                    d.record.partition,
                    d.record.offset,
                    d.code,
                    d.detail,
                )
            await self._retry("dlq", lambda: self.dead_letters.send_all(dead))
            for d in dead:
                metrics.DLQ.labels(d.reason).inc()
            metrics.ROWS.labels("dead_lettered").inc(len(dead))
        for tp, recs in batches.items():
            self._pending[tp] = recs[-1].offset + 1
        await self.commit_pending(None)
        self.batches_done += 1

    async def commit_pending(self, only: set[TopicPartition] | None) -> None:
        """Commit stored offsets of partitions we still own (all, or those in `only`)."""
        owned = self.consumer.assignment()
        offsets = {
            tp: off
            for tp, off in self._pending.items()
            if tp in owned and (only is None or tp in only)
        }
        # Offsets of partitions we no longer own are dropped: the new owner redelivers them,
        # and the rows are already there, so the redelivery is a no-op.
        self._pending = {tp: o for tp, o in self._pending.items() if tp in owned}
        if not offsets:
            return
        try:
            await self.consumer.commit(offsets)
        except KafkaError as exc:
            # CommitFailedError during a rebalance, or a coordinator blip: the records will be
            # redelivered (harmless) unless a later commit of higher offsets succeeds first.
            metrics.COMMIT_FAILURES.inc()
            logger.warning("offset commit failed (%r); records may be redelivered", exc)
            return
        for tp, off in offsets.items():
            if self._pending.get(tp) == off:
                del self._pending[tp]

    async def _retry(self, what: str, attempt_fn: Callable[[], Awaitable[T]]) -> T:
        """Run attempt_fn until it succeeds, sleeping a capped backoff between transient
        failures; while any batch waits here the main loop keeps the partitions paused."""
        attempt = 0
        try:
            while True:
                try:
                    return await attempt_fn()
                except (TransientWriteError, DeadLetterSendError) as exc:
                    if self._stopping.is_set():
                        raise Stopped from exc
                    if attempt == 0:
                        if not self._retrying:
                            self._failing_since = time.monotonic()
                        self._retrying += 1
                    attempt += 1
                    metrics.RETRIES.labels(what).inc()
                    if isinstance(exc, WriteTimeout):
                        metrics.DB_TIMEOUTS.inc()
                    s = self.settings
                    delay = backoff_delay(
                        attempt - 1, base=s.retry_backoff_base_s, cap=s.retry_backoff_cap_s
                    )
                    logger.warning(
                        "%s failed transiently (attempt %d, retry in %.2fs): %s",
                        what,
                        attempt,
                        delay,
                        exc,
                    )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), delay)
                    if self._stopping.is_set():
                        raise Stopped from exc
        finally:
            if attempt:
                self._retrying -= 1
                if not self._retrying:
                    self._failing_since = None

    async def _update_lag(self) -> None:
        now = time.monotonic()
        if now - self._lag_updated < 1.0:
            return
        self._lag_updated = now
        for tp in self.consumer.assignment():
            high = self.consumer.highwater(tp)
            if high is None:
                continue
            try:
                pos = await asyncio.wait_for(self.consumer.position(tp), 0.1)
            except (TimeoutError, KafkaError):
                continue
            metrics.LAG.labels(tp.topic, str(tp.partition)).set(max(0, high - pos))
