"""The garbage collector's settings for processes under a crowd: the gateway and the issuer, and
the load driver's workers that play the crowd.

Under a crowd these processes allocate a few container objects per request that outlive it
briefly (futures, coroutines, answers in flight). With CPython's default first threshold (700)
a gateway made ~2,700 young collections per 60,000 forwarded issues and spent 6-8 % of its CPU
in the collector (`make bench-gateway`, measured with gc.callbacks, issue 13). At 3,000 the
same run spent 0.2-0.3 s instead of 0.7-1.5 s in the collector, with no pause above 9 ms; at
10,000 the total fell further but single middle-generation passes took 24-30 ms, which a
shopper waits through. The older generations keep their defaults.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 3_000
# A count of middle-generation passes no burst reaches: no full collection until the process ends.
_NEVER = 1 << 30


def settle_after_startup() -> None:
    """Once start-up has built what lives as long as the process: collect its garbage, move the
    rest out of the collector's passes (gc.freeze: never walked again), and collect the young
    generation less often."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


def hold_full_collections() -> None:
    """For a process that lives through one burst and then exits (a load driver's worker): no
    full collection from now on, while the younger passes still free short-lived cycles.

    A worker keeps one record per request until the end. Each full collection walked them all
    (up to ~66,000 in one worker of `make demo`: 7 full passes, the longest 82 ms of wall
    time), and every request in flight during such a pause was measured that much slower, as
    if the servers had been."""
    young, older, _ = gc.get_threshold()
    gc.set_threshold(young, older, _NEVER)
