"""A circuit breaker as a pure state machine (the caller supplies the clock).

closed --N consecutive failures--> open --after open_seconds--> half-open (one probe at a time)
half-open --probe succeeds--> closed;  half-open --probe fails--> open again.

While open the gateway answers 503 + Retry-After at once instead of queueing requests behind a
failing issuer; the single half-open probe finds out cheaply whether it is back.

What counts as a failure is decided by `verdict`: an upstream that does not answer (timeout,
refused, reset) or answers 500/502/504 is failing; a 503 is a deliberate answer from a working
upstream ("my store is failing over, retry": the issuer sends it before the gateway's deadline)
and leaves the breaker as it was — otherwise a Redis failover would open every issuer's
breaker and keep shoppers out for `open_seconds` after Redis is back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum


class State(IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class Verdict(IntEnum):
    SUCCESS = 0
    FAILURE = 1
    NEUTRAL = 2  # counts neither way (a half-open probe is released)


def verdict(status: int) -> Verdict:
    """How an upstream's HTTP answer counts for its breaker (no answer at all is a FAILURE)."""
    if status == 503:
        return Verdict.NEUTRAL
    return Verdict.FAILURE if status >= 500 else Verdict.SUCCESS


@dataclass
class Breaker:
    failure_threshold: int = 5
    open_seconds: float = 5.0
    state: State = State.CLOSED
    failures: int = 0
    opened_at: float = 0.0
    probing: bool = False

    def retry_after(self, now: float) -> float:
        """Seconds until a request may pass (0.0: it may pass now)."""
        if self.state is State.CLOSED:
            return 0.0
        if self.state is State.OPEN:
            return max(0.0, self.opened_at + self.open_seconds - now)
        return self.open_seconds if self.probing else 0.0

    def try_acquire(self, now: float) -> bool:
        """Whether a request may go upstream now; a half-open pass is the probe."""
        if self.state is State.CLOSED:
            return True
        if self.state is State.OPEN:
            if now - self.opened_at < self.open_seconds:
                return False
            self.state = State.HALF_OPEN
            self.probing = False
        if self.probing:
            return False
        self.probing = True
        return True

    def on_success(self) -> None:
        self.state = State.CLOSED
        self.failures = 0
        self.probing = False

    def on_failure(self, now: float) -> None:
        self.failures += 1
        if self.state is State.HALF_OPEN or self.failures >= self.failure_threshold:
            self.state = State.OPEN
            self.opened_at = now
            self.probing = False

    def on_abandoned(self) -> None:
        """The probe was cancelled before an answer: let another request probe."""
        self.probing = False


def retry_after_header(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))
