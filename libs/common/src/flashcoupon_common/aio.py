"""Awaiting several things at once, one loop turn sooner than asyncio.gather."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TypeVar

T = TypeVar("T")


async def in_order(awaitables: Sequence[Awaitable[T]]) -> list[T]:
    """The results of `awaitables`, in order; all of them run (or travel) at once.

    For hot paths, in place of gather: each is awaited one after another, so the caller
    resumes a loop turn after the last one is done, where gather first runs its own callback
    for each and then wakes the caller, a turn later. Under a crowd a loop turn is long: a
    gateway press with two rate-limit calls went 1.12x faster this way (docs/gateway.md).
    Futures (a batcher's replies) are awaited as they are; coroutines become tasks first.
    When one fails, or the caller is cancelled, the others are cancelled and their errors
    retrieved, as gather would have reported them.
    """
    futures = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return [await f for f in futures]
    except BaseException:
        for f in futures:
            if not f.done():
                f.cancel()
            elif not f.cancelled():
                f.exception()
        raise
