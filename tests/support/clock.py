"""A clock tests move by hand, for code that takes `clock: Callable[[], float]`.

Expiry, rate and repeat decisions are tested by advancing this clock, never by sleeping.
"""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
