"""Per-event admission settings (CouponEvent `spec.admission`), cached for about a second.

Concurrent requests for the same event share one read (a burst of 10,000 requests must not
become 10,000 HGETs), and the cached value is used for `ttl` seconds, so an operator's change
applies within that time (at once when provisioning announces it on SUPPLY_CHANNEL). The same
read says whether the event is sold out (pause flag and stock, same slot): it is handed to the
SoldOutBoard, so a gateway knows a sell-out it did not hear announced within `ttl` too.

An entry is read again in the background once it is half its `ttl` old, while it is still
served: under a crowd that read waits a few turns of a busy event loop (one turn serves
hundreds of connections), and once an entry had expired every press of the event arriving
meanwhile waited on it. In two `make demo --concurrency 512` runs 1,025 presses waited 50-97 ms
that way, and after the sell-out each gateway's whole crowd (256 presses) stopped every second,
because the sold-out lane only asks `fresh` and nothing read the entry until it had expired.
With the read ahead only the first read of the burst is waited on. A value is still never used
more than `ttl` after it was read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from flashcoupon_common import keys
from flashcoupon_common.event_spec import EventSpec
from redis.asyncio.cluster import RedisCluster

from flashcoupon_gateway.sold_out import SoldOutBoard, sold_out_in_state

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EventInfo:
    spec: EventSpec | None  # None: not provisioned (the issuer answers 404)

    @property
    def start_ms(self) -> int:
        return 0 if self.spec is None else int(self.spec.start_at.timestamp() * 1000)


def _s(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


async def read_event(redis: RedisCluster, event_id: str) -> tuple[EventSpec | None, bool]:
    """The event's spec (None: not provisioned) and whether it is sold out now."""
    cfg, stock = await asyncio.gather(
        redis.hmget(keys.config_key(event_id), ["spec", "paused"]),
        redis.hmget(keys.stock_key(event_id), ["n", "q"]),
    )
    raw_spec, paused = cfg
    spec = None if raw_spec is None else EventSpec.from_json(raw_spec)
    quantity = _s(stock[1])
    sold_out = sold_out_in_state(
        provisioned=spec is not None and quantity is not None,
        paused=_s(paused) == "1",
        issued=int(_s(stock[0]) or 0),
        quantity=int(quantity or 0),
        end_ms=0 if spec is None else int(spec.end_at.timestamp() * 1000),
        now_ms=int(time.time() * 1000),
    )
    return spec, sold_out


@dataclass(frozen=True, slots=True)
class _Read:
    future: asyncio.Future[EventInfo]
    started: float  # time.monotonic()
    epoch: int  # SpecCache._epoch when it began


class SpecCache:
    def __init__(self, redis: RedisCluster, ttl_seconds: float, board: SoldOutBoard) -> None:
        self.redis = redis
        self.ttl = ttl_seconds
        self.refresh_after = ttl_seconds / 2
        self.board = board
        self._cache: dict[str, tuple[float, EventInfo]] = {}
        self._pending: dict[str, asyncio.Future[EventInfo]] = {}
        self._refreshing: set[asyncio.Task[None]] = set()
        # Bumped by `forget`: a read that began before the change must not be cached after it.
        self._epoch: dict[str, int] = {}
        # event -> the entry whose read ahead failed: not tried again (Redis may be down; the
        # entry expires soon and the next press reads, and fails, in the foreground).
        self._ahead_failed: dict[str, float] = {}

    async def get(self, event_id: str) -> EventInfo:
        info = self.cached(event_id)
        if info is not None:
            return info
        pending = self._pending.get(event_id)
        if pending is not None:
            return await asyncio.shield(pending)
        return await self._read(event_id, self._begin(event_id))

    def _usable(self, event_id: str, read_at: float) -> bool:
        """Whether an entry read at `read_at` may still be used; past half its life, it is read
        again in the background (once at a time) while it still serves."""
        age = time.monotonic() - read_at
        if (
            age >= self.refresh_after
            and event_id not in self._pending
            and self._ahead_failed.get(event_id) != read_at
        ):
            self._refresh(event_id, read_at)
        return age < self.ttl

    def _refresh(self, event_id: str, read_at: float) -> None:
        """Read the event again without anyone waiting on it (the cached value still serves)."""
        read = self._begin(event_id)
        task = asyncio.get_running_loop().create_task(self._read_quietly(event_id, read, read_at))
        self._refreshing.add(task)
        task.add_done_callback(self._refreshing.discard)

    async def _read_quietly(self, event_id: str, read: _Read, read_at: float) -> None:
        try:
            await self._read(event_id, read)
        except Exception as exc:  # noqa: BLE001 - the entry expires; the next press reads it
            if len(self._ahead_failed) > 10_000:
                self._ahead_failed.clear()
            self._ahead_failed[event_id] = read_at
            logger.warning("reading event %s ahead of its expiry failed: %s", event_id, exc)

    def _begin(self, event_id: str) -> _Read:
        """Register a read of the event now (others wait on it instead of reading too)."""
        read = _Read(
            asyncio.get_running_loop().create_future(),
            time.monotonic(),
            self._epoch.get(event_id, 0),
        )
        self._pending[event_id] = read.future
        return read

    async def _read(self, event_id: str, read: _Read) -> EventInfo:
        try:
            spec, sold_out = await read_event(self.redis, event_id)
            info = EventInfo(spec)
            self.board.observed(event_id, sold_out, read.started)
        except BaseException as exc:
            if not read.future.done():  # aclose may have cancelled it
                read.future.set_exception(exc)
                read.future.exception()  # retrieved: waiters re-raise it, no "never retrieved"
            raise
        finally:
            self._pending.pop(event_id, None)
        if read.epoch == self._epoch.get(event_id, 0):
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[event_id] = (time.monotonic(), info)
        if not read.future.done():
            read.future.set_result(info)
        return info

    def cached(self, event_id: str) -> EventInfo | None:
        """The event's state when it was read within `ttl` (what `get` answers without reading
        or awaiting), else None.

        The hot route asks this before `get` (a coroutine less per press), and the sold-out
        lane instead of it: it keeps the entry read ahead too, or after a sell-out the lane
        would stop every `ttl` until a full press read it again."""
        hit = self._cache.get(event_id)
        return hit[1] if hit is not None and self._usable(event_id, hit[0]) else None

    def forget(self, event_id: str) -> None:
        """The event's settings changed (SUPPLY_CHANNEL): the next request reads them again."""
        self._cache.pop(event_id, None)
        if len(self._epoch) > 10_000:
            self._epoch.clear()
        self._epoch[event_id] = self._epoch.get(event_id, 0) + 1

    async def aclose(self) -> None:
        """Stop the reads running ahead of expiry (and fail whoever still waits on one)."""
        tasks = list(self._refreshing)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()
