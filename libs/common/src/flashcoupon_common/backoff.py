"""The one retry delay every flashcoupon loop uses (relay, persister, wallet publisher, batcher).

Capped exponential with jitter in [d/2, d], d = min(cap, base * 2**attempt), attempt counted
from 0. Half fixed, half random: processes that failed together do not retry in lockstep, and
none retries in a hot loop.
"""

from __future__ import annotations

import random
from collections.abc import Callable


def backoff_delay(
    attempt: int, *, base: float, cap: float, rand: Callable[[], float] = random.random
) -> float:
    ceiling = min(cap, base * float(2 ** min(attempt, 30)))
    return ceiling / 2 + rand() * ceiling / 2
