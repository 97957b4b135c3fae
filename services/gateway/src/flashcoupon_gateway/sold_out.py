"""What this gateway process knows about sell-outs: the one place the issue route and the
waiting room read.

Two sources feed it. The event channels push news the moment it happens: issue.lua publishes
the sell-out with the last coupon, provisioning publishes a supply change (a raised quantity
re-opens the event). And every read of the event's state (admission.SpecCache, about once a
second per event) says whether it is sold out now, which covers a gateway that started after
the sell-out or missed a message while its subscription was reconnecting.

The subtle part is ordering: a read that started before a message arrived may answer after
it, with older facts; it must not undo the news. So a read counts only if no message about the
event arrived after the read started.

Only a real sell-out counts: the channel message comes from the issue that took the last coupon,
and a read calls an event sold out only when it is provisioned, not paused, not ended and
every coupon is issued (`sold_out_in_state`) — a paused or unknown event never is, so its
shoppers still reach the issuer, which answers PAUSED or EVENT_NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from flashcoupon_common import keys

_CAPACITY = 10_000  # events remembered; only provisioned events ever get here


def sold_out_in_state(
    *, provisioned: bool, paused: bool, issued: int, quantity: int, end_ms: int, now_ms: int
) -> bool:
    """Whether an event's state read from Redis means "sold out" to a shopper now.

    The issuer checks pause and the window before stock, so a paused or ended event is answered
    PAUSED / ENDED even when no coupon is left: the gateway must not answer SOLD_OUT for it.
    """
    return provisioned and not paused and now_ms < end_ms and issued >= quantity


class SoldOutBoard:
    def __init__(self, on_reopen: Callable[[str], None] | None = None) -> None:
        # Told when a sold-out event is open again (supply raised): its holders change.
        self._on_reopen = on_reopen
        self._sold: set[str] = set()
        self._heard_at: dict[str, float] = {}  # event -> monotonic time of its latest message
        self._wakers: dict[str, asyncio.Event] = {}

    def is_sold_out(self, event_id: str) -> bool:
        return event_id in self._sold

    def heard(self, channel: str, event_id: str, at: float | None = None) -> None:
        """A message on the event channels (SOLD_OUT_CHANNEL or SUPPLY_CHANNEL)."""
        if len(self._heard_at) >= _CAPACITY and event_id not in self._heard_at:
            self._heard_at.clear()
        self._heard_at[event_id] = time.monotonic() if at is None else at
        self._set(event_id, channel == keys.SOLD_OUT_CHANNEL)

    def observed(self, event_id: str, sold_out: bool, read_started: float) -> None:
        """A read of the event's state that started at `read_started` (monotonic)."""
        heard = self._heard_at.get(event_id)
        if heard is not None and heard >= read_started:
            return  # the message is newer than what the read saw
        self._set(event_id, sold_out)

    async def wait(self, event_id: str, seconds: float) -> None:
        """Sleep `seconds`, or less if the event sells out meanwhile (wakes SSE streams)."""
        if event_id in self._sold:
            return
        waker = self._wakers.get(event_id)
        if waker is None:
            waker = self._wakers[event_id] = asyncio.Event()
        try:
            async with asyncio.timeout(seconds):
                await waker.wait()
        except TimeoutError:
            pass

    def _set(self, event_id: str, sold_out: bool) -> None:
        if not sold_out:
            if event_id in self._sold:
                self._sold.discard(event_id)
                if self._on_reopen is not None:
                    self._on_reopen(event_id)
            return
        if len(self._sold) >= _CAPACITY:
            self._sold.clear()
        self._sold.add(event_id)
        waker = self._wakers.pop(event_id, None)
        if waker is not None:
            waker.set()


class Unsettled:
    """Shoppers this process answered 503 on an issue, per event, for `ttl` seconds.

    A 503 leaves the shopper not knowing whether they got a coupon (docs/gateway.md, the 503
    contract): their next press must reach the issuer, which tells them (409 DUPLICATE with the
    coupon) even after the sell-out. So the sold-out answer is not given to them here. Per
    process and bounded (oldest dropped first): a retry landing on another gateway replica
    gets 410 and finds the coupon in `GET /v1/me/coupons`.
    """

    def __init__(self, ttl: float = 600.0, capacity: int = 100_000) -> None:
        self.ttl = ttl
        self.capacity = capacity
        self._until: dict[tuple[str, str], float] = {}  # insertion order = age

    def add(self, event_id: str, user: str, now: float | None = None) -> None:
        key = (event_id, user)
        self._until.pop(key, None)
        self._until[key] = (time.monotonic() if now is None else now) + self.ttl
        if len(self._until) > self.capacity:
            del self._until[next(iter(self._until))]

    def __contains__(self, key: tuple[str, str]) -> bool:
        until = self._until.get(key)
        if until is None:
            return False
        if until < time.monotonic():
            del self._until[key]
            return False
        return True
