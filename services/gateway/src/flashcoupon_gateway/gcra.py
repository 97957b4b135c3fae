"""GCRA (generic cell rate algorithm) maths, as plain functions; lua/ratelimit.lua mirrors them.

GCRA keeps one number per key, the theoretical arrival time (TAT): when the bucket would be
empty again if every admitted request had arrived exactly on the emission interval
T = 1/rate. A request at `now` is allowed when TAT' = max(TAT, now) + T·cost stays within
`burst`·T of now. Same admissions as a token bucket of size `burst` refilled at `rate`, but
with one integer of state, no refill bookkeeping and an exact Retry-After. Times are integer
microseconds of the Redis server's clock, so replicas never disagree about "now".

`want` > 1 asks for several tokens at once (a lease, see ratelimit.py): as many as conform
are granted, at least one or none.

The deny-until cache is the per-process pre-limit: when Redis rejects a key with a
retry-after, nobody (on any replica) can make that key conform before then — a rejection does
not move TAT and other admissions only push it later — so answering 429 locally until then is
exact, and a flooding client costs Redis one call per retry window instead of one per request.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field

MICROS = 1_000_000


@dataclass(frozen=True, slots=True)
class Limit:
    per_second: float
    burst: int
    # The emission interval T in microseconds (at least 1), ":<T>:<burst>", the suffix of a
    # key kept under this limit (ratelimit.Check), and the RateLimit-Limit and
    # RateLimit-Policy header values (bytes, as sent): computed once, read on every press.
    interval_us: int = field(init=False, compare=False)
    signature: str = field(init=False, compare=False)
    burst_header: bytes = field(init=False, compare=False)
    policy_header: bytes = field(init=False, compare=False)

    def __post_init__(self) -> None:
        interval = max(1, round(MICROS / self.per_second))
        object.__setattr__(self, "interval_us", interval)
        object.__setattr__(self, "signature", f":{interval}:{self.burst}")
        object.__setattr__(self, "burst_header", b"%d" % self.burst)
        window = max(1, round(self.burst / self.per_second))
        object.__setattr__(self, "policy_header", b"%d;w=%d" % (self.burst, window))


@functools.lru_cache(maxsize=1024)
def limit(per_second: float, burst: int) -> Limit:
    """The Limit of these parameters, made once: a press names its limits from settings and
    event specs, which take few distinct values."""
    return Limit(per_second, burst)


@dataclass(frozen=True, slots=True)
class Decision:
    granted: int  # tokens granted (0: rejected)
    new_tat: int | None  # the TAT to store (None: unchanged, the request was rejected)
    retry_after_us: int  # 0 when allowed
    remaining: int  # requests still allowed right now, after this grant
    reset_us: int  # until the bucket is full again

    @property
    def allowed(self) -> bool:
        return self.granted > 0


def decide(tat: int | None, now: int, limit: Limit, want: int = 1) -> Decision:
    t = limit.interval_us
    tolerance = t * limit.burst
    base = now if tat is None or tat < now else tat
    room = tolerance - (base - now)  # capacity left, in microseconds of emission
    affordable = room // t
    if affordable < 1:
        return Decision(0, None, t - room, 0, base - now)
    n = min(want, affordable)
    new_tat = base + n * t
    return Decision(n, new_tat, 0, affordable - n, new_tat - now)


def retry_after_seconds(retry_after_us: int) -> int:
    """Retry-After is whole seconds (RFC 9110); round up so a client never retries too early."""
    return max(1, math.ceil(retry_after_us / MICROS))


class DenyCache:
    """Keys Redis rejected, with the local monotonic time until which they stay rejected."""

    def __init__(self, max_keys: int = 100_000) -> None:
        self._until: dict[str, float] = {}
        self._max = max_keys

    def blocked_for(self, key: str, now: float | None = None) -> float:
        """Seconds the key stays rejected (0.0: ask Redis)."""
        until = self._until.get(key)
        if until is None:
            return 0.0
        left = until - (time.monotonic() if now is None else now)
        if left <= 0:
            del self._until[key]
            return 0.0
        return left

    def block(self, key: str, seconds: float, now: float | None = None) -> None:
        if len(self._until) >= self._max:
            self._until.clear()  # bounded memory; the cost is a few extra Redis calls
        self._until[key] = (time.monotonic() if now is None else now) + seconds
