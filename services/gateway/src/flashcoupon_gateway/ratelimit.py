"""Rate limits shared by every gateway replica: GCRA state in Redis Cluster.

Keys are hash-tagged so the load spreads over the cluster's nodes: per user
`{rl:u:<user>}:<what>`, per client IP `{rl:ip:<ip>}`, and an event's admission cap split into N
sub-keys `{rl:ev:<event>:<shard>}` with rate/N each, so one hot event is served by several
nodes instead of pinning one. Each decision is one script call (lua/ratelimit.lua).

Checks run in stages: client (IP and user, concurrently), then the event cap, so a request
the per-user limit refuses never spends the event's admission budget. Two per-process
pre-limits save Redis work without ever admitting more than Redis debited:

- deny cache: a key Redis rejected is refused locally until its retry time (gcra.DenyCache);
- leases: a key this process sees many requests for (a hot event shard, a NAT'ed client IP)
  asks Redis for up to K tokens in one call and spends the extra ones locally for at most
  LEASE_SECONDS. K is bounded by the key's recent local demand, a quarter of its burst and
  LEASE_SECONDS of its rate, so a key with a small burst (a shopper's per-user limit) is always
  decided exactly, one call per request. Every admitted request was debited in Redis first; a
  lease only moves a debit up to LEASE_SECONDS earlier, and unused leased tokens are lost.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import deque
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from flashcoupon_common.aio import in_order
from flashcoupon_common.http import Headers, ProblemError

from flashcoupon_gateway import gcra
from flashcoupon_gateway.metrics import RATE_LIMITED
from flashcoupon_gateway.scripts import RATELIMIT, ScriptRunner


# Check and Outcome are made for every request: NamedTuples, immutable like a frozen
# dataclass at well under half its construction cost (~0.6 against ~1.6 us).
class Check(NamedTuple):
    scope: str  # ip | user | event: the metric label and the problem's `scope`
    base: str  # the hash-tagged key name, e.g. {rl:ip:10.0.0.1}
    limit: gcra.Limit

    @property
    def key(self) -> str:
        """The Redis key: the name plus the limit's parameters, because a TAT only means
        something under the interval and burst that produced it. Processes configured
        differently (a rolling config change, or tests sharing one Redis) keep separate state
        instead of misreading each other's."""
        return self.base + self.limit.signature


class Outcome(NamedTuple):
    check: Check
    allowed: bool
    retry_after_us: int
    remaining: int
    reset_us: int


LEASE_SECONDS = 0.1
# The presses waiting for a key's lease call, in arrival order: each is handed a leased token,
# the call's refusal, or None (its turn to ask).
Queue = deque[asyncio.Future[Outcome | None]]
_MAX_TRACKED = 50_000


def lease_size(limit: gcra.Limit, demand: int) -> int:
    """Tokens to ask for: recent local demand, capped by a quarter burst and LEASE_SECONDS."""
    cap = min(limit.burst // 4, int(limit.per_second * LEASE_SECONDS))
    return max(1, min(demand, cap))


@dataclass(slots=True)
class _Lease:
    tokens: int
    remaining: int  # what Redis said was left when the lease was granted
    expires: float


def _take(c: Check, lease: _Lease) -> Outcome:
    """An admission spent from a lease that has a token left."""
    lease.tokens -= 1
    return Outcome(c, True, 0, lease.remaining + lease.tokens, 0)


def user_key(user: str, what: str) -> str:
    return "{rl:u:" + user + "}:" + what


def ip_key(ip: str) -> str:
    return "{rl:ip:" + ip + "}"


def event_shard_key(event_id: str, shard: int) -> str:
    return "{rl:ev:" + event_id + ":" + str(shard) + "}"


def event_shard_limit(max_per_second: float, shards: int) -> gcra.Limit:
    """Each shard's share of the cap; the burst is ~100 ms of the cap, spread over the shards."""
    per_shard = max_per_second / shards
    return gcra.limit(per_shard, max(1, math.ceil(max_per_second / 10 / shards)))


RATE_HEADER_NAMES = (
    "RateLimit-Limit",
    "RateLimit-Remaining",
    "RateLimit-Reset",
    "RateLimit-Policy",
)
_LIMIT, _REMAINING, _RESET, _POLICY = (n.lower().encode() for n in RATE_HEADER_NAMES)


def rate_headers(outcomes: Sequence[Outcome]) -> Headers:
    """RateLimit-* headers (IETF draft) for the most constraining of the outcomes, as an ASGI
    message carries them: the issue route sends them without a Response object."""
    if not outcomes:
        return []
    tight = outcomes[0] if len(outcomes) == 1 else min(outcomes, key=_tightness)
    limit = tight.check.limit
    return [
        (_LIMIT, limit.burst_header),
        (_REMAINING, b"%d" % tight.remaining),
        (_RESET, b"%d" % -(-tight.reset_us // gcra.MICROS)),  # whole seconds, rounded up
        (_POLICY, limit.policy_header),
    ]


def _tightness(outcome: Outcome) -> tuple[bool, int]:
    return outcome.allowed, outcome.remaining


def rate_limited(outcome: Outcome) -> ProblemError:
    retry = gcra.retry_after_seconds(outcome.retry_after_us)
    raw = rate_headers([outcome])
    headers = {name: v.decode() for name, (_, v) in zip(RATE_HEADER_NAMES, raw, strict=True)}
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
        self._leases: dict[str, _Lease] = {}
        self._demand: dict[str, tuple[float, int]] = {}  # key -> (window start, requests)
        # One lease call in flight per key, and the presses queued behind it: they wait for
        # its reply instead of each leasing K tokens (which would debit K times what is needed).
        self._inflight: dict[str, Queue] = {}

    def refuse_if_denied(self, c: Check) -> None:
        """429 at once when Redis refused this key lately (the deny cache)."""
        left = self.deny.blocked_for(c.key)
        if left > 0:
            RATE_LIMITED.labels(c.scope, "local").inc()
            raise rate_limited(Outcome(c, False, int(left * gcra.MICROS), 0, 0))

    def allowance_outcome(self, c: Check, said: tuple[int, int, int], asked_at: float) -> Outcome:
        """The outcome of a check the issuer decided with the issue (issue.lua's allowance:
        left, reset µs, retry-after µs); a refusal is remembered like one from a limiter call
        and raised as the same 429."""
        left, reset_us, retry_us = said
        return self._settled(Outcome(c, retry_us == 0, retry_us, left, reset_us), asked_at)

    def _settled(self, outcome: Outcome, asked_at: float) -> Outcome:
        """`outcome` as answered: a refusal is remembered in the deny cache until its retry
        time and raised as the 429. Redis decided somewhere between `asked_at` and now, so
        blocking from `asked_at` never blocks past the true retry time, however late this
        process read the reply."""
        if not outcome.allowed:
            waited = time.monotonic() - asked_at
            self.deny.block(outcome.check.key, outcome.retry_after_us / gcra.MICROS - waited)
            RATE_LIMITED.labels(outcome.check.scope, "redis").inc()
            raise rate_limited(outcome)
        return outcome

    async def check_all(self, stages: Sequence[Sequence[Check]]) -> list[Outcome]:
        """Run the stages in order; raise 429 (a ProblemError) at the first rejection."""
        outcomes: list[Outcome] = []
        for stage in stages:
            for c in stage:
                self.refuse_if_denied(c)
            now = time.monotonic()
            results = [self._leased(c, now) for c in stage]
            asked = [i for i, o in enumerate(results) if o is None]
            if len(asked) == 1:
                results[asked[0]] = await self._decide(stage[asked[0]], now)
            elif asked and all(self._want(stage[i], now) == 1 for i in asked):
                # A crowd's usual stage (a new shopper from a new address): each check one
                # script call, all sent before the first is awaited (no task per check).
                replies = await in_order([self._ask(stage[i], 1) for i in asked])
                for i, reply in zip(asked, replies, strict=True):
                    results[i] = self._outcome(stage[i], reply, now)
            elif asked:
                decided = await asyncio.gather(*(self._decide(stage[i], now) for i in asked))
                for i, o in zip(asked, decided, strict=True):
                    results[i] = o
            for outcome in results:
                assert outcome is not None
                outcomes.append(self._settled(outcome, now))
        return outcomes

    def event_check(self, event_id: str, max_per_second: float) -> Check:
        """The event cap's next shard, round-robin, skipping shards known to be full."""
        limit = event_shard_limit(max_per_second, self.event_shards)
        first = next(self._rr)
        for i in range(self.event_shards):
            check = Check(
                "event", event_shard_key(event_id, (first + i) % self.event_shards), limit
            )
            if self.deny.blocked_for(check.key) <= 0:
                return check
        return Check("event", event_shard_key(event_id, first % self.event_shards), limit)

    def _leased(self, c: Check, now: float, count: bool = True) -> Outcome | None:
        """An admission from this process's lease on the key, or None (ask Redis)."""
        if count:
            start, seen = self._demand.get(c.key, (now, 0))
            if now - start > LEASE_SECONDS:
                start, seen = now, 0
            if len(self._demand) > _MAX_TRACKED:
                self._demand.clear()
            self._demand[c.key] = (start, seen + 1)
        lease = self._leases.get(c.key)
        if lease is None:
            return None
        if lease.tokens <= 0 or lease.expires < now:
            del self._leases[c.key]
            return None
        return _take(c, lease)

    def _want(self, c: Check, now: float, queued: int = 0) -> int:
        """Tokens to ask for: the key's recent demand here, or the presses queued for the
        call when more (under a slow loop more wait than arrived within the window)."""
        return lease_size(c.limit, max(self._demand.get(c.key, (now, 1))[1], queued + 1))

    async def _decide(self, c: Check, now: float) -> Outcome:
        """A lease call for the key, or a place in the queue behind the one in flight. The
        queued presses are served when its reply is read, not when each wakes: under a crowd
        one loop turn can outlast LEASE_SECONDS, and presses that woke to a lease already
        expired asked again one by one (issue 13, one address at 512 connections: 1,045
        calls and 245k waits for 22k presses, 82 % of the leased tokens lost, p99 0.8 s)."""
        queue = self._inflight.get(c.key)
        if queue is None:
            if self._want(c, now) == 1:
                return await self._call(c, 1, now)
            queue = self._inflight[c.key] = deque()
        else:
            turn: asyncio.Future[Outcome | None] = asyncio.get_running_loop().create_future()
            queue.append(turn)
            try:
                served = await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled() and turn.result() is None:
                    self._serve_queue(c, queue, None)  # its turn to ask: passed on
                raise
            if served is not None:
                return served
            now = time.monotonic()  # this press asks next, for itself and those still queued
        # Whatever lease is left is spent or expired (else this press would have taken from
        # it), so the one _serve_queue finds afterwards is this call's own.
        self._leases.pop(c.key, None)
        outcome = None
        try:
            outcome = await self._call(c, self._want(c, now, len(queue)), now)
            return outcome
        finally:
            self._serve_queue(c, queue, outcome)

    def _serve_queue(self, c: Check, queue: Queue, outcome: Outcome | None) -> None:
        """Hand the call's answer to the presses queued behind it, in order: a leased token
        each while they last (taken as the reply is read, as a call of their own would have
        been admitted), the refusal to all when it was refused. The first press left over
        makes the next call; the queue stays in flight for it."""
        lease = self._leases.get(c.key)
        while queue:
            turn = queue.popleft()
            if turn.done():  # its request was cancelled
                continue
            if outcome is not None and not outcome.allowed:
                turn.set_result(outcome)
            elif outcome is not None and lease is not None and lease.tokens > 0:
                turn.set_result(_take(c, lease))
            else:
                turn.set_result(None)
                return
        del self._inflight[c.key]

    async def _call(self, c: Check, want: int, now: float) -> Outcome:
        return self._outcome(c, await self._ask(c, want), now)

    def _ask(self, c: Check, want: int) -> Awaitable[Any]:
        return self.runner.run(RATELIMIT, [c.key], [c.limit.interval_us, c.limit.burst, want])

    def _outcome(self, c: Check, reply: Sequence[Any], now: float) -> Outcome:
        """Redis's decision; tokens granted beyond the first become this process's lease."""
        granted, retry, remaining, reset = reply
        granted = int(granted)
        if granted > 1:
            if len(self._leases) > _MAX_TRACKED:
                self._leases.clear()
            self._leases[c.key] = _Lease(granted - 1, int(remaining), now + LEASE_SECONDS)
        return Outcome(c, granted > 0, int(retry), int(remaining), int(reset))
