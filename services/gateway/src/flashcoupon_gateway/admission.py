"""Per-event admission settings (CouponEvent `spec.admission`), cached for about a second.

The spec is read with flashcoupon_common.event_state.read_spec. Concurrent requests for the
same event share one read (a burst of 10,000 requests must not become 10,000 HGETs), and the
cached value is used for `ttl` seconds, so an operator's change applies within that time.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from flashcoupon_common import event_state
from flashcoupon_common.event_spec import EventSpec
from redis.asyncio.cluster import RedisCluster


@dataclass(frozen=True, slots=True)
class EventInfo:
    spec: EventSpec | None  # None: not provisioned (the issuer answers 404)

    @property
    def start_ms(self) -> int:
        return 0 if self.spec is None else int(self.spec.start_at.timestamp() * 1000)


async def read_spec(redis: RedisCluster, event_id: str) -> EventSpec | None:
    return await event_state.read_spec(redis, event_id)


class SpecCache:
    def __init__(self, redis: RedisCluster, ttl_seconds: float) -> None:
        self.redis = redis
        self.ttl = ttl_seconds
        self._cache: dict[str, tuple[float, EventInfo]] = {}
        self._pending: dict[str, asyncio.Future[EventInfo]] = {}

    async def get(self, event_id: str) -> EventInfo:
        hit = self._cache.get(event_id)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        pending = self._pending.get(event_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[EventInfo] = asyncio.get_running_loop().create_future()
        self._pending[event_id] = future
        try:
            info = EventInfo(await read_spec(self.redis, event_id))
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody logs "never retrieved"
            raise
        finally:
            self._pending.pop(event_id, None)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[event_id] = (time.monotonic(), info)
        future.set_result(info)
        return info
