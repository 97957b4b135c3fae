"""Per-event admission settings (CouponEvent `spec.admission`), cached for about a second.

Concurrent requests for the same event share one read (a burst of 10,000 requests must not
become 10,000 HGETs), and the cached value is used for `ttl` seconds, so an operator's change
applies within that time (at once when provisioning announces it on SUPPLY_CHANNEL). The same
read says whether the event is sold out (pause flag and stock, same slot): it is handed to the
SoldOutBoard, so a gateway knows a sell-out it did not hear announced within `ttl` too.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from flashcoupon_common import keys
from flashcoupon_common.event_spec import EventSpec
from redis.asyncio.cluster import RedisCluster

from flashcoupon_gateway.sold_out import SoldOutBoard, sold_out_in_state


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


class SpecCache:
    def __init__(self, redis: RedisCluster, ttl_seconds: float, board: SoldOutBoard) -> None:
        self.redis = redis
        self.ttl = ttl_seconds
        self.board = board
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
        started = time.monotonic()
        try:
            spec, sold_out = await read_event(self.redis, event_id)
            info = EventInfo(spec)
            self.board.observed(event_id, sold_out, started)
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

    def fresh(self, event_id: str) -> bool:
        """Whether the event's state was read within `ttl` (a request now would not read it)."""
        hit = self._cache.get(event_id)
        return hit is not None and time.monotonic() - hit[0] < self.ttl

    def forget(self, event_id: str) -> None:
        """The event's settings changed (SUPPLY_CHANNEL): the next request reads them again."""
        self._cache.pop(event_id, None)
