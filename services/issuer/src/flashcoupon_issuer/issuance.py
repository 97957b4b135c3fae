"""Issuing a coupon: one script call, the reply turned into an Outcome, sold-out remembered.

The decisions here are plain: `parse_reply` maps issue.lua's reply, `SoldOutCache` decides when
SOLD_OUT can be answered without Redis. The subtle part is a retry after the sell-out: a
request carrying an Idempotency-Key may repeat one that got a coupon just before the event sold
out, and must get that coupon back. Clients send a key with every press, so sending keyed
requests to Redis would put the whole sold-out storm back on Redis; instead each process keeps
the keyed coupons it issued recently (`ReplayCache`) and answers those retries from it. A retry
that reaches a *different* issuer process after the sell-out costs a script call instead (the
next paragraph); a gateway routing by user keeps it local (docs/gateway.md, "Issuer routing").

The local flag answers SOLD_OUT only to users known to hold nothing (flashcoupon_common.holders:
the event's holders, loaded once per sell-out): a holder whose first answer was lost — a timeout
the issuer never saw as one, a retry on another issuer process — goes to the script, which
answers their coupon (a replay or DUPLICATE).

A 503 is indeterminate: the script may have run while its answer was lost (a master dying
mid-batch), or may still run after the caller's deadline. The contract is "retry; you will learn
your coupon", so a shopper answered 503 is remembered (`Unsettled`) and their next presses go
to Redis even after the sell-out: the script answers the replay (same key) or DUPLICATE with the
code (no key). Each call is bounded by the deadline the gateway sends (`call_budget`), so the
issuer answers before the gateway stops waiting instead of issuing after a gateway 503.

Over 300 lines on purpose: this is the issue hot path, and the reply parsing, the three
memories (sold out, replays, unsettled) and `IssueService` are read together to follow one
request; the memories are the seam should it grow (a `memory.py` of ~100 lines).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

from flashcoupon_common.holders import Holders, holds_nothing
from flashcoupon_common.messages import Discount
from flashcoupon_common.redis_batch import NotReplicatedError
from redis.exceptions import ResponseError

from flashcoupon_issuer import metrics

logger = logging.getLogger(__name__)

# The shopper's per-event allowance the gateway asks issue.lua to decide with the issue:
# (emission interval in µs, burst); None: not decided here (docs/gateway.md).
AllowanceLimit = tuple[int, int] | None
# One press as issue.lua takes it: (user id, request id, traceparent, allowance).
ScriptPress = tuple[str, str, str, AllowanceLimit]
# (event id, presses of that event, deadline as time.monotonic() or None) → the script's
# replies, one per press in order: one script run for all of them (redis_batch.submit_many).
ScriptCall = Callable[[str, Sequence[ScriptPress], float | None], Awaitable[list[Any]]]
# One press of IssueService.issue_many:
# (event id, user id, request id, traceparent, keyed, allowance)
PressArgs = tuple[str, str, str, str, bool, AllowanceLimit]


class IssuerUnavailable(Exception):
    """Redis could not be reached within the call's deadline (the script may still have run)."""


def call_budget(budget_ms: int | None, retry_deadline_s: float, margin_ms: int) -> float:
    """Seconds one issue call may take, retries included.

    `budget_ms` is what the caller (the gateway) will still wait for the answer; the issuer
    keeps `margin_ms` of it to write the 503 and for the answer to travel back, so the caller
    hears the issuer's answer instead of timing out on its own while the issuer goes on. Without
    a budget (a direct call) the issuer's own retry deadline applies. Never below 50 ms: a
    budget that is nearly spent still gets one attempt.
    """
    if budget_ms is None:
        return retry_deadline_s
    return max(0.05, min(retry_deadline_s, (budget_ms - margin_ms) / 1000))


# Coupon and Outcome are NamedTuples, not frozen dataclasses: every answered press builds one
# of each, and a frozen dataclass's __init__ (one object.__setattr__ per field) costs three
# times as much; both stay immutable.
class Coupon(NamedTuple):
    code: str
    tier: str
    discount: Discount
    issued_at_ms: int
    expires_at_ms: int


class Allowance(NamedTuple):
    """What the shopper's allowance said about a press it decided (issue.lua)."""

    left: int  # presses still allowed right now, after this one
    reset_us: int  # until the allowance is full again
    retry_after_us: int = 0  # > 0: this press was refused (LIMITED)


class Outcome(NamedTuple):
    # ISSUED DUPLICATE SOLD_OUT NOT_STARTED ENDED PAUSED NOT_FOUND NOT_DURABLE LIMITED
    status: str
    coupons: tuple[Coupon, ...] = ()
    remaining: int | None = None  # after this request; None when the script did not say
    replay: bool = False  # ISSUED for a request id that had already issued
    at_ms: int | None = None  # startAt for NOT_STARTED, endAt for ENDED
    allowance: Allowance | None = None  # when the script decided the shopper's allowance


SOLD_OUT = Outcome("SOLD_OUT", remaining=0)


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _opt_int(v: Any) -> int | None:
    text = _s(v)
    return int(text) if text else None


# A tier's discount as issue.lua describes it (type, amount, percent, max) -> Discount: an
# event has a handful of tiers, so each description is parsed once. Bounded: the descriptions
# of every event a process has issued for, cleared when it grows past the bound.
_DISCOUNTS: dict[tuple[Any, ...], Discount] = {}


def _discount(kind: Any, amount: Any, percent: Any, max_amount: Any) -> Discount:
    described = (kind, amount, percent, max_amount)
    discount = _DISCOUNTS.get(described)
    if discount is None:
        if len(_DISCOUNTS) >= 1024:
            _DISCOUNTS.clear()
        discount = _DISCOUNTS[described] = Discount(
            "fixed" if _s(kind) == "fixed" else "percent",
            amount=_opt_int(amount),
            percent=_opt_int(percent),
            max_amount=_opt_int(max_amount),
        )
    return discount


def _coupon(reply: Sequence[Any], i: int) -> Coupon:
    """The coupon whose eight fields start at `reply[i]`."""
    return Coupon(
        _s(reply[i]),
        _s(reply[i + 1]),
        _discount(reply[i + 2], reply[i + 3], reply[i + 4], reply[i + 5]),
        int(reply[i + 6]),
        int(reply[i + 7]),
    )


def parse_reply(reply: Sequence[Any]) -> Outcome:
    """issue.lua's reply → Outcome (layout documented at the top of issue.lua)."""
    status = _s(reply[0])
    second = int(reply[1])
    count = int(reply[3])
    allowance = None
    if len(reply) > 4 + 8 * count:  # the allowance's two values end the reply
        left, reset = int(reply[-2]), int(reply[-1])
        allowance = Allowance(left, reset, second if status == "LIMITED" else 0)
        if status == "LIMITED":
            return Outcome(status, allowance=allowance)
    coupons = tuple([_coupon(reply, i) for i in range(4, 4 + 8 * count, 8)])
    if status in ("NOT_STARTED", "ENDED"):
        return Outcome(status, at_ms=second, allowance=allowance)
    # Positional (status, coupons, remaining, replay, at_ms, allowance): a third cheaper to
    # make than by keywords. Only ISSUED and SOLD_OUT say how much stock is left; PAUSED and
    # NOT_FOUND carry a placeholder 0 that must not read as "sold out" (issue 10).
    remaining = second if second >= 0 and status in _STOCK_ANSWERS else None
    return Outcome(status, coupons, remaining, int(reply[2]) == 1, None, allowance)


_STOCK_ANSWERS = frozenset({"ISSUED", "SOLD_OUT"})


def proves_sold_out(outcome: Outcome) -> bool:
    """Whether an answer shows the event has no coupon left: a SOLD_OUT reply, or the reply
    that took the last coupon. Nothing else may set the sold-out flag — a paused or unknown
    event cached as sold out would turn 423/404 into a false 410."""
    if outcome.status == "SOLD_OUT":
        return True
    return outcome.status in ("ISSUED", "NOT_DURABLE") and outcome.remaining == 0


class SoldOutCache:
    """Events known to be sold out, each for `ttl` seconds after it was last learned.

    Only events that exist and sold out are learned (`proves_sold_out`, the sold-out channel),
    and expired flags are pruned once there are more than PRUNE_AT: the size is bounded by the
    events that sold out within the last `ttl` seconds, not by what URLs shoppers try.
    """

    PRUNE_AT = 256

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock  # injected by tests, so expiry needs no sleeping
        self._until: dict[str, float] = {}

    def known(self, event_id: str) -> bool:
        until = self._until.get(event_id)
        if until is None:
            return False
        if self._clock() < until:
            return True
        del self._until[event_id]
        return False

    def learn(self, event_id: str) -> None:
        if self.ttl <= 0:
            return
        now = self._clock()
        if len(self._until) >= self.PRUNE_AT:
            self._until = {e: t for e, t in self._until.items() if t > now}
        self._until[event_id] = now + self.ttl

    def __len__(self) -> int:
        return len(self._until)

    def forget(self, event_id: str) -> None:
        self._until.pop(event_id, None)


class ReplayCache:
    """The last `capacity` coupons this process issued for keyed requests, by (event, user, key).

    Holds the script's raw reply as a tuple of bytes and ints: the garbage collector does not
    track such tuples, so 100k entries add nothing to the cost of collections (dataclass
    Outcomes would: every full collection would walk them all).
    """

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._items: OrderedDict[tuple[str, str, str], tuple[Any, ...]] = OrderedDict()

    def get(self, event_id: str, user_id: str, key: str) -> Outcome | None:
        reply = self._items.get((event_id, user_id, key))
        if reply is None:
            return None
        earlier = parse_reply(reply)
        return Outcome("ISSUED", earlier.coupons, remaining=0, replay=True)

    def put(self, event_id: str, user_id: str, key: str, reply: Sequence[Any]) -> None:
        self._items[(event_id, user_id, key)] = tuple(reply)
        if len(self._items) > self.capacity:
            self._items.popitem(last=False)


class Unsettled:
    """(event, user) pairs answered 503 in the last `ttl` seconds, at most `capacity` of them.

    Their next presses bypass the local sold-out flag: the coupon a 503 may hide must be
    learned from Redis. Few in number (a failover's worth), so the sold-out storm stays local.
    """

    def __init__(
        self,
        ttl: float = 600.0,
        capacity: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self._clock = clock  # injected by tests, so expiry needs no sleeping
        self.capacity = capacity
        self._until: OrderedDict[tuple[str, str], float] = OrderedDict()

    def add(self, event_id: str, user_id: str) -> None:
        key = (event_id, user_id)
        self._until[key] = self._clock() + self.ttl
        self._until.move_to_end(key)
        if len(self._until) > self.capacity:
            self._until.popitem(last=False)

    def __contains__(self, key: tuple[str, str]) -> bool:
        if not self._until:  # the common case: nothing unsettled, no tuple lookups
            return False
        until = self._until.get(key)
        if until is None:
            return False
        if self._clock() < until:
            return True
        del self._until[key]
        return False

    def __len__(self) -> int:
        return len(self._until)


class IssueService:
    def __init__(
        self,
        call: ScriptCall,
        sold_out: SoldOutCache,
        replays: ReplayCache | None = None,
        *,
        holders: Holders,
        retry_deadline_s: float = 15.0,
        deadline_margin_ms: int = 300,
        unconfirmed: str = "fail",
    ) -> None:
        self._call = call
        self.sold_out = sold_out
        self.holders = holders
        self.replays = replays or ReplayCache()
        self.unsettled = Unsettled()
        self.retry_deadline_s = retry_deadline_s
        self.deadline_margin_ms = deadline_margin_ms
        self.degrade = unconfirmed == "degrade"
        self._degraded = False  # answering unconfirmed coupons right now (for the log line)

    async def issue(
        self,
        event_id: str,
        user_id: str,
        request_id: str,
        traceparent: str,
        *,
        keyed: bool,
        budget_ms: int | None = None,
        allowance: AllowanceLimit = None,
    ) -> Outcome | IssuerUnavailable:
        """The press's outcome, or an IssuerUnavailable (returned, not raised: the edge answers
        it with a 503 as it answers any outcome) when Redis could not be used."""
        local, unknown = self._answer_locally(event_id, user_id, request_id, keyed)
        if unknown:
            await self.holders.get(event_id)
            local, _ = self._answer_locally(event_id, user_id, request_id, keyed)
        if local is not None:
            return local
        seconds = self.seconds_for(budget_ms)
        call = self._submit(event_id, user_id, request_id, traceparent, allowance, seconds)
        try:
            if budget_ms is None:
                await call
            else:
                # The batcher stops retrying at the deadline; the timeout also bounds a batch
                # already on the wire. Cancelling the call's future keeps it from being sent.
                async with asyncio.timeout(seconds):
                    await call
        except Exception:  # noqa: BLE001 - the call's future holds what happened
            pass
        return self.settle(call, event_id, user_id, request_id, keyed, seconds)

    def seconds_for(self, budget_ms: int | None) -> float:
        """How long a press's script call may take, given the caller's budget (`call_budget`
        with this service's retry deadline and margin)."""
        return call_budget(budget_ms, self.retry_deadline_s, self.deadline_margin_ms)

    def start(
        self,
        event_id: str,
        user_id: str,
        request_id: str,
        traceparent: str,
        *,
        keyed: bool,
        seconds: float,
        allowance: AllowanceLimit = None,
    ) -> Outcome | asyncio.Future[list[Any]] | None:
        """`issue` up to its script call, awaiting nothing: the outcome when it is decided
        here, else the call's future (bounded by the batcher at `seconds`; `settle` it once
        done), or None while the event's holders are not loaded (then `issue` the press).

        For the issuer's direct answers (http.IssueEdge.direct_answer): a press answered from
        the future's done callback needs no task or coroutine (docs/issuer.md)."""
        local, unknown = self._answer_locally(event_id, user_id, request_id, keyed)
        if unknown:
            return None
        if local is not None:
            return local
        return self._submit(event_id, user_id, request_id, traceparent, allowance, seconds)

    def _submit(
        self,
        event_id: str,
        user_id: str,
        request_id: str,
        traceparent: str,
        allowance: AllowanceLimit,
        seconds: float,
    ) -> asyncio.Future[list[Any]]:
        deadline = time.monotonic() + seconds
        press = (user_id, request_id, traceparent, allowance)
        return asyncio.ensure_future(self._call(event_id, [press], deadline))

    def settle(
        self,
        call: asyncio.Future[list[Any]],
        event_id: str,
        user_id: str,
        request_id: str,
        keyed: bool,
        seconds: float,
    ) -> Outcome | IssuerUnavailable:
        """The outcome of one press's script call (`start`, `issue`), done or given up on:
        one not done, or cancelled, by its deadline timed out."""
        replies, error = _reply_or_error(call, seconds)
        ((reply, error),) = each_press(replies, error, 1)
        return self._conclude(event_id, user_id, request_id, keyed, reply, error, seconds)

    async def issue_many(
        self, presses: Sequence[PressArgs], budget_ms: int | None = None
    ) -> list[Outcome | IssuerUnavailable]:
        """Each press answered as `issue` answers it alone, with one wait for all their script
        calls: one call per event, carrying that event's presses.

        Why not `issue` per press: a task and a timer per press cost the issuer more of its
        loop than the issuing itself once a gateway forwards presses in batches (docs/issuer.md,
        "Batching"), and so did a future per press ("One call per event of a batch"). Here the
        calls are submitted together and awaited once, under one deadline.
        """
        decided = [self._answer_locally(p[0], p[1], p[2], p[4]) for p in presses]
        unknown = [i for i, (_, holders_unknown) in enumerate(decided) if holders_unknown]
        for event_id in {presses[i][0] for i in unknown}:
            await self.holders.get(event_id)
        for i in unknown:
            decided[i] = self._answer_locally(*presses[i][:3], presses[i][4])
        seconds = self.seconds_for(budget_ms)
        deadline = time.monotonic() + seconds
        results: list[Outcome | IssuerUnavailable | None] = [local for local, _ in decided]
        pending: dict[str, list[int]] = {}  # event id → its presses for the script
        for i, press in enumerate(presses):
            if results[i] is None:
                pending.setdefault(press[0], []).append(i)
        calls: dict[str, asyncio.Future[list[Any]]] = {}
        for event_id, indices in pending.items():
            mine = [presses[i] for i in indices]
            script_presses = [(p[1], p[2], p[3], p[5]) for p in mine]
            calls[event_id] = asyncio.ensure_future(self._call(event_id, script_presses, deadline))
        if calls:
            try:
                _, late = await asyncio.wait(calls.values(), timeout=seconds)
            except BaseException:
                for future in calls.values():
                    future.cancel()
                raise
            for future in late:
                future.cancel()  # a cancelled call is never sent again
        for event_id, future in calls.items():
            indices = pending[event_id]
            replies, error = _reply_or_error(future, seconds)
            for i, (reply, press_error) in zip(
                indices, each_press(replies, error, len(indices)), strict=True
            ):
                _, user_id, request_id, _, keyed, _ = presses[i]
                results[i] = self._conclude(
                    event_id, user_id, request_id, keyed, reply, press_error, seconds
                )
        return [r for r in results if r is not None]  # each press has its outcome by now

    def _answer_locally(
        self, event_id: str, user_id: str, request_id: str, keyed: bool
    ) -> tuple[Outcome | None, bool]:
        """(the outcome decided without Redis: a replay, or sold out to a non-holder; or None,
        and whether the event's holders must be loaded before it can be decided). A failed
        load leaves them unknown: the press then goes to the script."""
        if self.sold_out.known(event_id) and (event_id, user_id) not in self.unsettled:
            earlier = self.replays.get(event_id, user_id, request_id) if keyed else None
            if earlier is not None:
                metrics.count_outcome(event_id, "REPLAYED")
                return earlier, False
            known = self.holders.cached(event_id)
            if known is None:
                return None, True
            if holds_nothing(known, user_id):
                metrics.count_sold_out_local(event_id)
                metrics.count_outcome(event_id, "SOLD_OUT")
                return SOLD_OUT, False
            # A holder: the script tells them their coupon.
        return None, False

    def _conclude(
        self,
        event_id: str,
        user_id: str,
        request_id: str,
        keyed: bool,
        reply: Any,
        error: Exception | None,
        seconds: float,
    ) -> Outcome | IssuerUnavailable:
        """The outcome of a script call that gave `reply` or failed with `error`.

        An IssuerUnavailable when Redis could not be used (the shopper is then unsettled);
        an error that is not Redis's is raised again."""
        if error is None:
            outcome = parse_reply(reply)
            if self._degraded:
                self._degraded = False
                logger.warning("durability restored: a replica confirms writes again")
        elif isinstance(error, NotReplicatedError):
            reply = error.result
            outcome = parse_reply(reply)
            if outcome.status == "ISSUED" and self.degrade:
                metrics.UNCONFIRMED.inc()
                if not self._degraded:
                    self._degraded = True
                    logger.warning(
                        "durability degraded: no replica confirms writes (%s); answering "
                        "unconfirmed coupons until one does",
                        error,
                    )
            elif outcome.status == "ISSUED":
                logger.warning("coupon for %s/%s not confirmed by a replica", event_id, user_id)
                outcome = Outcome(
                    "NOT_DURABLE", remaining=outcome.remaining, allowance=outcome.allowance
                )
                self.unsettled.add(event_id, user_id)
        elif isinstance(error, (OSError, TimeoutError, ConnectionError)):
            self.unsettled.add(event_id, user_id)
            return IssuerUnavailable(f"{error!r} within {seconds:.2f}s")
        elif error.__class__.__module__.startswith("redis"):
            # redis-py's own error classes (ConnectionError, TimeoutError, ClusterError) do not
            # all derive from the builtins; anything else from the call is Redis being unusable.
            self.unsettled.add(event_id, user_id)
            return IssuerUnavailable(repr(error))
        else:
            raise error
        if keyed and outcome.status == "ISSUED":
            self.replays.put(event_id, user_id, request_id, reply)
        if proves_sold_out(outcome):
            self.learn_sold_out(event_id)
        if outcome.remaining is not None:
            metrics.set_remaining(event_id, outcome.remaining)
        elif outcome.status == "ENDED":
            metrics.forget_stock(event_id)  # an ended event's stock is no longer news
        # A replay answers a coupon issued before: counted apart, so ISSUED counts coupons.
        metrics.count_outcome(event_id, "REPLAYED" if outcome.replay else outcome.status)
        return outcome

    def learn_sold_out(self, event_id: str) -> None:
        """The event sold out (again): a new sell-out may have new holders, so they are read
        afresh the first time they are needed."""
        if not self.sold_out.known(event_id):
            self.holders.forget(event_id)
        self.sold_out.learn(event_id)

    def supply_changed(self, event_id: str) -> None:
        """Provisioning changed the event (quantity raised: it may sell again)."""
        self.sold_out.forget(event_id)
        self.holders.forget(event_id)

    def forget_event(self, event_id: str) -> None:
        """The event was deleted: drop its flag and its metric series."""
        self.supply_changed(event_id)
        metrics.forget_event(event_id)


def each_press(
    replies: Any, error: Exception | None, presses: int
) -> list[tuple[Any, Exception | None]]:
    """Each press of one script call with its own reply or error. An error concerns them all,
    except that NotReplicatedError carries the script's replies: each press gets its own. A
    reply that is not one per press is an error for each (the script or its caller is wrong)."""
    unconfirmed = error if isinstance(error, NotReplicatedError) else None
    if error is not None and unconfirmed is None:
        return [(None, error)] * presses
    if unconfirmed is not None:
        replies = unconfirmed.result
    if not isinstance(replies, list) or len(replies) != presses:
        wrong = ResponseError(f"issue.lua: {presses} press(es), reply {replies!r:.80}")
        return [(None, wrong)] * presses
    if unconfirmed is None:
        return [(reply, None) for reply in replies]
    return [(None, NotReplicatedError(reply, unconfirmed.acked)) for reply in replies]


def _reply_or_error(future: asyncio.Future[Any], seconds: float) -> tuple[Any, Exception | None]:
    """A settled call's reply, or its error; a call cancelled at the deadline (or not done by
    then: a task still unwinding its cancellation) timed out."""
    if future.cancelled() or not future.done():
        return None, TimeoutError(f"no reply within {seconds:.2f}s")
    error = future.exception()
    if error is None:
        return future.result(), None
    if not isinstance(error, Exception):
        raise error  # KeyboardInterrupt and the like are not a press's outcome
    return None, error
