"""The stop signal every relay task shares.

Stopping has two moments: at `begin()` the relay stops reading new entries, and once the grace
period has passed, work still in flight is abandoned (`abandon()` turns true). What is
abandoned stays pending in Redis and is claimed by another relay, so abandoning loses nothing.
"""

from __future__ import annotations

import asyncio
import time


class Shutdown:
    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._deadline = float("inf")  # monotonic time after which in-flight work is abandoned

    def begin(self, grace_s: float) -> None:
        if not self._event.is_set():
            self._deadline = time.monotonic() + grace_s
            self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def abandon(self) -> bool:
        return self._event.is_set() and time.monotonic() >= self._deadline

    async def pause(self, seconds: float) -> None:
        """Sleep for `seconds`, or less if a stop is requested meanwhile."""
        try:
            await asyncio.wait_for(self._event.wait(), seconds)
        except TimeoutError:
            pass
