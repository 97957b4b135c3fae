"""One event's outbox stream, read through the relays' shared consumer group.

The subtle part is what "pending" means here. An entry read but not acknowledged sits in the
group's pending list under this relay's name. If this relay dies, another relay's XAUTOCLAIM
takes it over once it has been idle for claim_idle_ms; if this relay restarts under the same
name, it first re-reads its own pending entries (id 0). Either way the record may reach Kafka
twice — the persister's UNIQUE constraints make that harmless — but never zero times.

With durability "replica" an entry is published only once a replica holds it (`_confirmed`).
Otherwise a failover could discard an outbox entry the relay had already sent to Kafka: the
coupon would be in MySQL while the promoted master — the source of every later answer — never
issued it, and the shopper (answered 503 NOT_DURABLE: no replica confirmed) would be told
SOLD_OUT on retry although MySQL shows them a coupon. Confirmed first, a NOT_DURABLE coupon
either survives the failover in Redis (the retry reveals it) or never reaches MySQL.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from flashcoupon_common import keys
from flashcoupon_common.backoff import backoff_delay
from redis.asyncio.cluster import PipelineCommand, RedisCluster
from redis.exceptions import ResponseError

from flashcoupon_relay.delivery import GROUP, Delivery
from flashcoupon_relay.metrics import RelayMetrics
from flashcoupon_relay.policy import consumers_to_forget, gather_pause, should_retire
from flashcoupon_relay.settings import RelaySettings
from flashcoupon_relay.shutdown import Shutdown

logger = logging.getLogger(__name__)

Entries = list[tuple[bytes, dict[bytes, bytes]]]


def text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


class NotConfirmed(Exception):
    """No replica acknowledged an outbox batch within the WAIT timeout: it stays pending."""


def replicas_required(durability: str) -> int:
    return 1 if durability == "replica" else 0


class OutboxStream:
    def __init__(
        self,
        event_id: str,
        settings: RelaySettings,
        redis: RedisCluster,
        delivery: Delivery,
        metrics: RelayMetrics,
        shutdown: Shutdown,
        *,
        registered: Callable[[str], bool],
    ) -> None:
        self.event_id = event_id
        self.key = keys.outbox_key(event_id)
        self.settings = settings
        self._redis = redis
        self._delivery = delivery
        self._metrics = metrics
        self._shutdown = shutdown
        self._registered = registered  # is the event still in the last registry read?

    async def run(self) -> None:
        """Relay until stopped, or until the event left the registry and its outbox is empty."""
        s = self.settings
        event_id = self.event_id
        self._metrics.watch_event(event_id)
        group_ready = False
        own_pending = True  # at start and after any error: our own unacknowledged entries first
        next_claim = 0.0
        failures = 0
        while not self._shutdown.requested:
            try:
                if not group_ready:
                    # After an error the stream may have been deleted with its event (the
                    # finalizer's DEL comes just before its SREM): recreating the group would
                    # MKSTREAM an empty outbox of a deleted event that nothing ever removes.
                    if failures and await self._event_gone():
                        return
                    await self._ensure_group()
                    group_ready = True
                if own_pending:
                    await self._drain_own_pending()
                    own_pending = False
                if time.monotonic() >= next_claim:
                    next_claim = time.monotonic() + s.claim_interval_ms / 1000
                    await self._claim()
                entries = await self._read(">", block=True)
                if entries:
                    await self._deliver(entries)
                    pause = gather_pause(len(entries), s.batch_size, s.gather_ms)
                    if pause:
                        await self._shutdown.pause(pause)
                elif not self._registered(event_id) and await self._drained():
                    logger.info("event %s left the registry and its outbox is empty", event_id)
                    self._metrics.forget_event(event_id)
                    return
                failures = 0
            except ResponseError as exc:
                # NOGROUP: the stream was deleted between two calls; UNBLOCKED: while a blocking
                # XREADGROUP waited on it.
                gone = "NOGROUP" in str(exc) or "UNBLOCKED" in str(exc)
                if gone and await self._event_gone():
                    return
                group_ready = False
                failures = await self._after_error(exc, failures)
                own_pending = True
            except Exception as exc:  # noqa: BLE001 - Redis/Kafka trouble: back off, go on
                failures = await self._after_error(exc, failures)
                own_pending = True

    async def _ensure_group(self) -> None:
        try:
            # From id 0: entries written before any relay existed are relayed too.
            await self._redis.xgroup_create(self.key, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _event_gone(self) -> bool:
        """The stream or its group was deleted: stop for a deleted event; for a live one the
        caller recreates the group (from id 0, so nothing written meanwhile is skipped)."""
        try:
            live = await self._redis.sismember(keys.EVENTS_REGISTRY, self.event_id)
        except Exception:  # noqa: BLE001 - cannot tell: keep the stream and retry
            return False
        if not live:
            logger.info("outbox of event %s is gone", self.event_id)
            self._metrics.forget_event(self.event_id)
        return not live

    async def _after_error(self, exc: BaseException, failures: int) -> int:
        s = self.settings
        logger.warning("relaying %s failed (attempt %d): %r", self.event_id, failures + 1, exc)
        delay = backoff_delay(failures, base=s.backoff_base_ms / 1000, cap=s.backoff_max_ms / 1000)
        await self._shutdown.pause(delay)
        return failures + 1

    async def _read(self, start: str, *, block: bool = False) -> Entries:
        s = self.settings
        response: Any = await self._redis.xreadgroup(
            GROUP,
            s.consumer,
            {self.key: start},
            count=s.batch_size,
            block=s.block_ms if block else None,
        )
        for _stream, entries in response or []:
            return entries  # type: ignore[no-any-return]
        return []

    async def _drain_own_pending(self) -> None:
        """Entries this consumer name read before but never acknowledged (a restart)."""
        cursor = "0"
        while not self._shutdown.requested:
            entries = await self._read(cursor)
            if not entries:
                return
            logger.info("re-delivering %d own pending entries of %s", len(entries), self.event_id)
            await self._deliver(entries)
            cursor = text(entries[-1][0])

    async def _claim(self) -> None:
        """Take over entries idle on other (dead) relays, then forget long-dead consumers."""
        s, key = self.settings, self.key
        start: bytes | str = "0-0"
        while not self._shutdown.requested:
            nxt, entries, _deleted = await self._redis.xautoclaim(
                key, GROUP, s.consumer, s.claim_idle_ms, start_id=start, count=s.batch_size
            )
            if entries:
                self._metrics.claimed.labels(self.event_id).inc(len(entries))
                logger.warning("claimed %d idle entries of %s", len(entries), self.event_id)
                await self._deliver(entries)
            if text(nxt) == "0-0":
                break
            start = nxt
        consumers = await self._redis.xinfo_consumers(key, GROUP)
        for name in consumers_to_forget(consumers, me=s.consumer, idle_ms=s.forget_consumer_ms):
            # DELCONSUMER drops the consumer's pending entries; re-check they are none.
            pending = await self._redis.xpending_range(key, GROUP, "-", "+", 1, consumername=name)
            if not pending:
                await self._redis.xgroup_delconsumer(key, GROUP, name)
                logger.info("removed idle consumer %s from %s", name, key)

    async def _deliver(self, entries: Entries) -> None:
        await self._delivery.deliver(self.event_id, self.key, await self._confirmed(entries))

    async def _confirmed(self, entries: Entries) -> Entries:
        """The entries a replica holds (all of them, or NotConfirmed), with durability replica.

        WAIT covers the writes made on its own connection, and entries may have been read on
        any pooled connection (or by a relay that died): so on one connection to the stream's
        master, XCLAIM them to ourselves (min-idle 0, JUSTID: a write that is replicated, after
        every XADD of these entries) and then WAIT. Unconfirmed, the batch stays pending, the
        caller backs off and re-reads it. Entries gone from the stream meanwhile are dropped.
        """
        needed = replicas_required(self.settings.durability)
        if not needed or not entries:
            return entries
        s = self.settings
        ids = [entry_id for entry_id, _ in entries]
        claim = PipelineCommand(
            0, "XCLAIM", self.key, GROUP, s.consumer, 0, *ids, "JUSTID", parse_justid=True
        )
        wait = PipelineCommand(1, "WAIT", needed, s.wait_timeout_ms)
        node = self._redis.get_node_from_key(self.key)
        if node is None:
            raise NotConfirmed(f"no node serves {self.key} (cluster changing)")
        await node.execute_pipeline([claim, wait])
        claimed: Any = claim.result
        acked: Any = wait.result
        for result in (claimed, acked):
            if isinstance(result, Exception):
                raise result
        if int(acked) < needed:
            raise NotConfirmed(f"{acked} of {needed} replicas hold {len(ids)} entries")
        held = {text(i) for i in claimed}
        return [e for e in entries if text(e[0]) in held]

    async def _drained(self) -> bool:
        length = await self._redis.xlen(self.key)
        pending = (await self._redis.xpending(self.key, GROUP))["pending"]
        return should_retire(False, int(length), int(pending))
