"""Rate limits shared by every gateway replica: GCRA state in Redis Cluster.

Keys are hash-tagged so the load spreads over the cluster's nodes: per user
`{rl:u:<user>}:<what>`, per client IP `{rl:ip:<ip>}`, and an event's admission cap split into N
sub-keys `{rl:ev:<event>:<shard>}` with rate/N each, so one hot event is served by several
nodes instead of pinning one. Each decision is one script call (lua/ratelimit.lua).

Checks run in stages: client (IP and user, concurrently), then the event cap, so a request
the per-user limit refuses never spends the event's admission budget. A key Redis rejected is
remembered locally until its retry time (gcra.DenyCache), so floods are refused without Redis.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from flashcoupon_common.http import ProblemError

from flashcoupon_gateway import gcra
from flashcoupon_gateway.metrics import RATE_LIMITED
from flashcoupon_gateway.scripts import RATELIMIT, ScriptRunner


@dataclass(frozen=True, slots=True)
class Check:
    scope: str  # ip | user | event: the metric label and the problem's `scope`
    key: str
    limit: gcra.Limit


@dataclass(frozen=True, slots=True)
class Outcome:
    check: Check
    allowed: bool
    retry_after_us: int
    remaining: int
    reset_us: int


def user_key(user: str, what: str) -> str:
    return "{rl:u:" + user + "}:" + what


def ip_key(ip: str) -> str:
    return "{rl:ip:" + ip + "}"


def event_shard_key(event_id: str, shard: int) -> str:
    return "{rl:ev:" + event_id + ":" + str(shard) + "}"


def event_shard_limit(max_per_second: float, shards: int) -> gcra.Limit:
    """Each shard's share of the cap; the burst is ~100 ms of the cap, spread over the shards."""
    per_shard = max_per_second / shards
    return gcra.Limit(per_shard, max(1, math.ceil(max_per_second / 10 / shards)))


def rate_headers(outcomes: Sequence[Outcome]) -> dict[str, str]:
    """RateLimit-* headers (IETF draft) for the most constraining of the outcomes."""
    if not outcomes:
        return {}
    tight = min(outcomes, key=lambda o: (o.allowed, o.remaining))
    return {
        "RateLimit-Limit": str(tight.check.limit.burst),
        "RateLimit-Remaining": str(tight.remaining),
        "RateLimit-Reset": str(math.ceil(tight.reset_us / gcra.MICROS)),
        "RateLimit-Policy": f"{tight.check.limit.burst};w="
        f"{max(1, round(tight.check.limit.burst / tight.check.limit.per_second))}",
    }


def rate_limited(outcome: Outcome) -> ProblemError:
    retry = gcra.retry_after_seconds(outcome.retry_after_us)
    headers = rate_headers([outcome])
    headers["Retry-After"] = str(retry)
    return ProblemError(
        429,
        "RATE_LIMITED",
        f"too many requests ({outcome.check.scope} limit); retry after {retry}s",
        headers=headers,
        scope=outcome.check.scope,
        retryAfterMs=math.ceil(outcome.retry_after_us / 1000),
    )


class RateLimiter:
    def __init__(self, runner: ScriptRunner, *, event_shards: int) -> None:
        self.runner = runner
        self.event_shards = event_shards
        self.deny = gcra.DenyCache()
        self._rr = itertools.count()

    async def check_all(self, stages: Sequence[Sequence[Check]]) -> list[Outcome]:
        """Run the stages in order; raise 429 (a ProblemError) at the first rejection."""
        outcomes: list[Outcome] = []
        for stage in stages:
            for c in stage:
                left = self.deny.blocked_for(c.key)
                if left > 0:
                    RATE_LIMITED.labels(c.scope, "local").inc()
                    raise rate_limited(Outcome(c, False, int(left * gcra.MICROS), 0, 0))
            results = await asyncio.gather(*(self._decide(c) for c in stage))
            for o in results:
                if not o.allowed:
                    self.deny.block(o.check.key, o.retry_after_us / gcra.MICROS)
                    RATE_LIMITED.labels(o.check.scope, "redis").inc()
                    raise rate_limited(o)
            outcomes.extend(results)
        return outcomes

    def event_check(self, event_id: str, max_per_second: float) -> Check:
        """The event cap's next shard, round-robin, skipping shards known to be full."""
        limit = event_shard_limit(max_per_second, self.event_shards)
        first = next(self._rr)
        for i in range(self.event_shards):
            key = event_shard_key(event_id, (first + i) % self.event_shards)
            if self.deny.blocked_for(key) <= 0:
                return Check("event", key, limit)
        return Check("event", event_shard_key(event_id, first % self.event_shards), limit)

    async def _decide(self, c: Check) -> Outcome:
        allowed, retry, remaining, reset = await self.runner.run(
            RATELIMIT, [c.key], [c.limit.interval_us, c.limit.burst, 1]
        )
        return Outcome(c, bool(allowed), int(retry), int(remaining), int(reset))
