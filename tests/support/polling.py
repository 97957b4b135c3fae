"""Wait for a condition, never for a fixed time.

A test that sleeps "long enough" is slow on a quiet machine and flaky on a busy one (2 shared
cores). `wait_until` polls the condition itself and fails naming what it waited for.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

Condition = Callable[[], bool | Awaitable[bool]]


async def _holds(check: Condition) -> bool:
    result = check()
    if inspect.isawaitable(result):
        result = await result
    return bool(result)


async def wait_until(
    check: Condition, within: float, interval: float = 0.2, *, what: str = ""
) -> bool:
    """Poll `check` (sync or async) until it holds; True, or AssertionError after `within` s.

    Returns True so `assert await wait_until(...)` reads as the assertion it is.
    """
    deadline = time.monotonic() + within
    while True:
        if await _holds(check):
            return True
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what or check}")
        await asyncio.sleep(interval)
