"""Who holds a coupon of a sold-out event: the rule behind every SOLD_OUT short-cut.

The gateway and the issuer answer 410 SOLD_OUT without running the issue script once they know
an event is sold out (the crowd after a sell-out must not reach Redis). But a shopper who holds
a coupon — whose first answer was lost (a timeout, a 503) — must be told their coupon on retry
(DESIGN.md: a holder asking again is told what they hold), and only the script can tell them.
So a process answers SOLD_OUT from its cache only to users it knows hold nothing: when an event
sells out, it loads the event's holders once (HSCAN of the users hash, at most `quantity`
entries — no coupon is issued after the sell-out, so the set is complete) and sends holders on
to the script. Presses arriving while the set loads wait for that one load; when it cannot be
read within `Holders.timeout`, everybody goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from flashcoupon_common import keys

logger = logging.getLogger(__name__)

Loader = Callable[[str], Awaitable[frozenset[str]]]
_CAPACITY = 256  # sold-out events remembered; each set is at most the event's quantity


def holds_nothing(holders: frozenset[str] | None, user: str) -> bool:
    """Whether a sold-out answer from a cache is right for `user`: only when the holders are
    known and the user is not among them."""
    return holders is not None and user not in holders


# Entries per HSCAN call. Presses arriving while the set loads wait for it, and under a crowd
# each round trip waits a long loop turn: 10,000 holders took a gateway 31–35 ms to load in
# pages of 1,000 during `make demo`, and 15–16 ms in pages of 10,000 (docs/gateway.md). The
# master spends ~0.55 us per entry either way, so a page of 10,000 holds it ~2.6 ms.
SCAN_PAGE = 10_000


async def scan_holders(redis: Any, event_id: str, count: int = SCAN_PAGE) -> frozenset[str]:
    """Every user in the event's users hash (redis: an asyncio Redis or RedisCluster)."""
    users: set[str] = set()
    key = keys.users_key(event_id)
    cursor = 0
    while True:
        cursor, page = await redis.hscan(key, cursor, count=count)
        users.update(u.decode() if isinstance(u, bytes) else u for u in page)
        if int(cursor) == 0:
            return frozenset(users)


def _retrieve(task: asyncio.Task[frozenset[str]]) -> None:
    if not task.cancelled():
        task.exception()


class Holders:
    """Per sold-out event, its holders — loaded once, shared by concurrent requests."""

    def __init__(self, load: Loader, timeout: float = 2.0) -> None:
        self._load = load
        self.timeout = timeout
        self._known: dict[str, frozenset[str]] = {}
        self._loading: dict[str, asyncio.Task[frozenset[str]]] = {}

    def cached(self, event_id: str) -> frozenset[str] | None:
        return self._known.get(event_id)

    async def get(self, event_id: str) -> frozenset[str] | None:
        """The event's holders, loading them if needed; None when they could not be read in
        `timeout` seconds (the caller then asks the script)."""
        known = self._known.get(event_id)
        if known is not None:
            return known
        task = self._loading.get(event_id)
        if task is None:
            task = asyncio.create_task(self._fetch(event_id))
            task.add_done_callback(_retrieve)  # waiters may all have timed out
            self._loading[event_id] = task
        try:
            async with asyncio.timeout(self.timeout):
                return await asyncio.shield(task)
        except Exception as exc:  # noqa: BLE001 - unknown: the script answers instead
            logger.warning("holders of %s not loaded: %r", event_id, exc)
            return None

    async def holds_nothing(self, event_id: str, user: str) -> bool:
        known = self._known.get(event_id)  # the crowd's path: no await
        if known is not None:
            return user not in known
        return holds_nothing(await self.get(event_id), user)

    def forget(self, event_id: str) -> None:
        """Supply changed (or the event re-opened): the next sell-out loads the set again."""
        self._known.pop(event_id, None)
        self._loading.pop(event_id, None)

    async def _fetch(self, event_id: str) -> frozenset[str]:
        me = asyncio.current_task()
        try:
            holders = await self._load(event_id)
        finally:
            current = self._loading.get(event_id) is me
            if current:
                del self._loading[event_id]
        if current:  # not forgotten meanwhile: a set read before a supply change is stale
            if len(self._known) >= _CAPACITY:
                self._known.clear()
            self._known[event_id] = holders
        return holders
