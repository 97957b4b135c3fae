"""The issuer's plain decisions: reply parsing, the sold-out flag, the replay cache."""

from __future__ import annotations

import asyncio
from typing import Any

from flashcoupon_common.holders import Holders
from flashcoupon_issuer.issuance import IssueService, ReplayCache, SoldOutCache, parse_reply
from prometheus_client import REGISTRY

from tests.support.clock import FakeClock
from tests.support.issuer import NOBODY, per_press
from tests.support.metrics import sample

COUPON = [b"ABCD0123456789", b"big", b"fixed", b"10000", b"", b"", 1_000, 61_000]


def test_parse_issued_and_duplicate() -> None:
    o = parse_reply([b"ISSUED", 41, 0, 1, *COUPON])
    assert o.status == "ISSUED" and o.remaining == 41 and not o.replay
    c = o.coupons[0]
    assert (c.code, c.tier, c.discount.amount, c.discount.percent) == (
        "ABCD0123456789",
        "big",
        10000,
        None,
    )
    assert (c.issued_at_ms, c.expires_at_ms) == (1_000, 61_000)
    d = parse_reply([b"DUPLICATE", -1, 0, 2, *COUPON, *COUPON])
    assert d.status == "DUPLICATE" and d.remaining is None and len(d.coupons) == 2
    assert parse_reply([b"ISSUED", -1, 1, 1, *COUPON]).replay


def test_parse_gives_each_coupon_its_own_tier_discount() -> None:
    """Discounts are parsed once per description and shared: a batch of two tiers' coupons
    still gets each tier's own discount, equal to one parsed afresh."""
    from flashcoupon_common.messages import Discount

    percent = [b"PCT0123456789", b"small", b"percent", b"", b"5", b"3000", 2_000, 62_000]
    percent_uncapped = [b"PCT9876543210", b"tiny", b"percent", b"", b"7", b"", 3_000, 63_000]
    for _ in range(2):  # the second pass answers from the cache
        d = parse_reply([b"DUPLICATE", -1, 0, 3, *COUPON, *percent, *percent_uncapped])
        fixed, capped, uncapped = (c.discount for c in d.coupons)
        assert fixed == Discount("fixed", amount=10000)
        assert capped == Discount("percent", percent=5, max_amount=3000)
        assert uncapped == Discount("percent", percent=7)
        assert [c.tier for c in d.coupons] == ["big", "small", "tiny"]
        assert [c.issued_at_ms for c in d.coupons] == [1_000, 2_000, 3_000]


def test_stock_gauge_reads_the_latest_stock_and_is_forgotten() -> None:
    """The stock gauge is read when scraped: it says the last stock an answer carried, and an
    ended or deleted event's series goes away (and comes back if the event answers again)."""
    from flashcoupon_issuer import metrics

    name = "flashcoupon_issuer_stock_remaining"
    metrics.set_remaining("ev-stock", 41)
    metrics.set_remaining("ev-stock", 40)
    assert REGISTRY.get_sample_value(name, {"event": "ev-stock"}) == 40
    metrics.forget_stock("ev-stock")
    assert REGISTRY.get_sample_value(name, {"event": "ev-stock"}) is None
    metrics.set_remaining("ev-stock", 7)
    assert REGISTRY.get_sample_value(name, {"event": "ev-stock"}) == 7
    metrics.forget_event("ev-stock")
    assert REGISTRY.get_sample_value(name, {"event": "ev-stock"}) is None


def test_parse_window_answers_carry_the_time() -> None:
    assert parse_reply([b"NOT_STARTED", 5000, 0, 0]).at_ms == 5000
    assert parse_reply([b"ENDED", 9000, 0, 0]).at_ms == 9000
    assert parse_reply([b"SOLD_OUT", 0, 0, 0]).remaining == 0


def test_sold_out_flag_expires_and_can_be_forgotten() -> None:
    clock = FakeClock()
    cache = SoldOutCache(ttl=0.05, clock=clock)
    assert not cache.known("e")
    cache.learn("e")
    clock.advance(0.049)
    assert cache.known("e")
    clock.advance(0.002)
    assert not cache.known("e")
    cache.learn("e")
    cache.forget("e")
    assert not cache.known("e")
    SoldOutCache(ttl=0).learn("x")  # ttl 0 disables the flag


def test_replay_cache_is_bounded() -> None:
    cache = ReplayCache(capacity=2)
    reply = [b"ISSUED", 1, 0, 1, *COUPON]
    for k in ("a", "b", "c"):
        cache.put("e", "u", k, reply)
    assert cache.get("e", "u", "a") is None
    hit = cache.get("e", "u", "c")
    assert hit is not None and hit.replay and hit.coupons == parse_reply(reply).coupons


def test_service_learns_sold_out_from_the_last_coupon() -> None:
    calls: list[Any] = []

    async def script(*args: str) -> list[Any]:
        calls.append(args)
        return [b"ISSUED", 0, 0, 1, *COUPON]

    async def scenario() -> None:
        service = IssueService(per_press(script), SoldOutCache(ttl=60), holders=NOBODY)
        first = await service.issue("ev", "u1", "k1", "", keyed=True)
        assert first.status == "ISSUED"
        assert (await service.issue("ev", "u2", "r", "", keyed=False)).status == "SOLD_OUT"
        again = await service.issue("ev", "u1", "k1", "", keyed=True)
        assert again.status == "ISSUED" and again.replay and again.coupons == first.coupons
        assert len(calls) == 1

    asyncio.run(scenario())


def test_iso_timestamps_are_utc_with_milliseconds() -> None:
    from flashcoupon_issuer.http import iso

    assert iso(0) == "1970-01-01T00:00:00.000Z"
    assert iso(1_795_435_530_005) == "2026-11-23T12:05:30.005Z"
    assert iso(1_795_435_530_999) == "2026-11-23T12:05:30.999Z"


def _fixed_script(reply: list[Any]) -> Any:
    async def script(*args: str) -> list[Any]:
        return reply

    return per_press(script)


def test_only_a_real_sell_out_is_learned() -> None:
    """issue.lua answers PAUSED and NOT_FOUND with a 0 where ISSUED/SOLD_OUT put `remaining`:
    that 0 says nothing about stock (issue 10, item 2)."""
    from flashcoupon_issuer.issuance import proves_sold_out

    assert proves_sold_out(parse_reply([b"SOLD_OUT", 0, 0, 0]))
    assert proves_sold_out(parse_reply([b"ISSUED", 0, 0, 1, *COUPON]))
    assert not proves_sold_out(parse_reply([b"ISSUED", 3, 0, 1, *COUPON]))
    assert not proves_sold_out(parse_reply([b"ISSUED", -1, 1, 1, *COUPON]))  # a replay
    for reply in ([b"PAUSED", 0, 0, 0], [b"NOT_FOUND", 0, 0, 0], [b"DUPLICATE", -1, 0, 0]):
        outcome = parse_reply(reply)
        assert not proves_sold_out(outcome), reply
        assert outcome.remaining is None, reply  # no stock gauge for these either


def test_paused_and_unknown_events_are_not_remembered_as_sold_out() -> None:
    async def scenario() -> None:
        for status in (b"PAUSED", b"NOT_FOUND"):
            cache = SoldOutCache(ttl=60)
            service = IssueService(_fixed_script([status, 0, 0, 0]), cache, holders=NOBODY)
            for i in range(3):
                assert (await service.issue("ev", f"u{i}", "r", "", keyed=False)).status == (
                    status.decode()
                )
            assert not cache.known("ev") and len(cache) == 0

    asyncio.run(scenario())


def test_sold_out_cache_is_bounded_by_live_flags() -> None:
    clock = FakeClock()
    cache = SoldOutCache(ttl=0.01, clock=clock)
    for i in range(5000):
        cache.learn(f"e{i}")
    clock.advance(0.02)
    cache.learn("last")
    assert len(cache) <= SoldOutCache.PRUNE_AT + 1


def test_call_budget_answers_before_the_caller_gives_up() -> None:
    from flashcoupon_issuer.issuance import call_budget

    assert call_budget(None, 15.0, 300) == 15.0  # no caller deadline: the issuer's own
    assert call_budget(2000, 15.0, 300) == 1.7  # the gateway's 2 s, less the margin
    assert call_budget(60_000, 15.0, 300) == 15.0  # never longer than the issuer's own
    assert call_budget(100, 15.0, 300) == 0.05  # nearly spent: one attempt still


def test_a_shopper_answered_503_learns_the_coupon_after_the_sell_out() -> None:
    """Issue 10 item 5: the script may have issued although the answer was 503; once the event
    is known sold out, that shopper's retry must still reach Redis (replay / DUPLICATE)."""
    replies: list[Any] = [TimeoutError(), [b"SOLD_OUT", 0, 0, 0], [b"DUPLICATE", -1, 0, 1, *COUPON]]
    calls: list[tuple[Any, ...]] = []

    async def script(*args: Any) -> list[Any]:
        calls.append(args)
        reply = replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def scenario() -> None:
        from flashcoupon_issuer.issuance import IssuerUnavailable

        service = IssueService(per_press(script), SoldOutCache(ttl=60), holders=NOBODY)
        unavailable = await service.issue("ev", "held", "r1", "", keyed=False, budget_ms=2000)
        assert isinstance(unavailable, IssuerUnavailable)
        assert (await service.issue("ev", "other", "r2", "", keyed=False)).status == "SOLD_OUT"
        assert service.sold_out.known("ev")
        # Known sold out: others are answered locally, the 503'd shopper goes to the script.
        assert (await service.issue("ev", "late", "r3", "", keyed=False)).status == "SOLD_OUT"
        assert len(calls) == 2
        again = await service.issue("ev", "held", "r4", "", keyed=False)
        assert again.status == "DUPLICATE" and again.coupons[0].code == "ABCD0123456789"
        assert len(calls) == 3

    asyncio.run(scenario())


def test_unsettled_is_bounded_and_expires() -> None:
    from flashcoupon_issuer.issuance import Unsettled

    clock = FakeClock()
    u = Unsettled(ttl=0.02, capacity=3, clock=clock)
    for i in range(5):
        u.add("e", f"u{i}")
    assert len(u) == 3 and ("e", "u0") not in u and ("e", "u4") in u
    clock.advance(0.03)
    assert ("e", "u4") not in u


def test_unconfirmed_coupon_fails_closed_or_degrades_by_setting() -> None:
    """durability=replica: a write no replica confirmed is 503 NOT_DURABLE ("fail") or, with
    "degrade", the coupon itself (counted and logged)."""
    from flashcoupon_common.redis_batch import NotReplicatedError

    async def script(*args: Any) -> list[Any]:
        raise NotReplicatedError([b"ISSUED", 5, 0, 1, *COUPON], 0)

    async def scenario() -> None:
        closed = IssueService(per_press(script), SoldOutCache(ttl=60), holders=NOBODY)
        assert (await closed.issue("ev", "u", "k", "", keyed=True)).status == "NOT_DURABLE"
        before = sample("flashcoupon_issuer_unconfirmed_total")
        open_ = IssueService(
            per_press(script), SoldOutCache(ttl=60), holders=NOBODY, unconfirmed="degrade"
        )
        outcome = await open_.issue("ev", "u", "k", "", keyed=True)
        assert outcome.status == "ISSUED" and outcome.coupons[0].code == "ABCD0123456789"
        assert sample("flashcoupon_issuer_unconfirmed_total") == before + 1

    asyncio.run(scenario())


def test_a_holder_is_told_the_coupon_after_the_sell_out_others_are_answered_locally() -> None:
    """A holder whose answer was lost (a client timeout the issuer never saw) retries without a
    key after the sell-out: the local flag must not answer 410 SOLD_OUT — only the script knows
    the coupon (chaos row gateway-redis-freeze, unrevealed_error)."""
    replies: list[Any] = [[b"ISSUED", 0, 0, 1, *COUPON], [b"DUPLICATE", -1, 0, 1, *COUPON]]
    calls: list[tuple[Any, ...]] = []
    loads: list[str] = []

    async def script(*args: Any) -> list[Any]:
        calls.append(args)
        return replies.pop(0)

    async def holders(event_id: str) -> frozenset[str]:
        loads.append(event_id)
        return frozenset({"held"})

    async def scenario() -> None:
        service = IssueService(per_press(script), SoldOutCache(ttl=60), holders=Holders(holders))
        assert (await service.issue("ev", "held", "r1", "", keyed=False)).status == "ISSUED"
        crowd = await asyncio.gather(
            *(service.issue("ev", f"u{i}", "r", "", keyed=False) for i in range(50))
        )
        assert {o.status for o in crowd} == {"SOLD_OUT"} and len(calls) == 1
        again = await service.issue("ev", "held", "r2", "", keyed=False)
        assert again.status == "DUPLICATE" and again.coupons[0].code == "ABCD0123456789"
        assert len(calls) == 2 and loads == ["ev"]  # one load for the whole crowd

    asyncio.run(scenario())


def test_holders_unreadable_sends_presses_to_the_script() -> None:
    async def script(*args: Any) -> list[Any]:
        return [b"SOLD_OUT", 0, 0, 0]

    async def broken(event_id: str) -> frozenset[str]:
        raise ConnectionError("redis away")

    async def scenario() -> None:
        calls = 0

        async def counted(*args: Any) -> list[Any]:
            nonlocal calls
            calls += 1
            return await script(*args)

        service = IssueService(per_press(counted), SoldOutCache(ttl=60), holders=Holders(broken))
        for i in range(3):
            assert (await service.issue("ev", f"u{i}", "r", "", keyed=False)).status == "SOLD_OUT"
        assert calls == 3  # no holders known: nobody is answered from the flag

    asyncio.run(scenario())


def test_a_new_sell_out_reads_the_holders_again() -> None:
    """Supply raised after a sell-out: the next sell-out has new holders."""
    sets = [frozenset({"a"}), frozenset({"a", "b"})]

    async def load(event_id: str) -> frozenset[str]:
        return sets.pop(0)

    async def scenario() -> None:
        service = IssueService(
            _fixed_script([b"SOLD_OUT", 0, 0, 0]), SoldOutCache(ttl=60), holders=Holders(load)
        )
        service.learn_sold_out("ev")
        assert await service.holders.get("ev") == frozenset({"a"})
        service.supply_changed("ev")
        service.learn_sold_out("ev")
        assert await service.holders.get("ev") == frozenset({"a", "b"})

    asyncio.run(scenario())


def _by_user(replies: dict[str, Any]) -> Any:
    """A script whose reply (or error, raised) depends on the press's user id."""

    async def script(event_id: str, user: str, *rest: Any) -> Any:
        reply = replies[user]
        if isinstance(reply, BaseException):
            raise reply
        if reply is None:
            await asyncio.Event().wait()  # never answers
        return reply

    return per_press(script)


def _summary(outcome: Any) -> tuple[str, ...]:
    from flashcoupon_issuer.issuance import IssuerUnavailable

    if isinstance(outcome, IssuerUnavailable):
        return ("UNAVAILABLE",)
    return (outcome.status, str(outcome.remaining), str(outcome.replay))


def test_a_batch_of_presses_is_answered_as_each_press_alone() -> None:
    """issue_many (the issuer's batch route) against issue, press by press: the same outcomes,
    the same shoppers unsettled, the same counts; one wait for every call, in order."""
    from flashcoupon_common.redis_batch import NotReplicatedError
    from flashcoupon_issuer.issuance import IssuerUnavailable
    from redis.exceptions import ClusterDownError

    replies = {
        "won": [b"ISSUED", 7, 0, 1, *COUPON],
        "dup": [b"DUPLICATE", -1, 0, 1, *COUPON],
        "late": TimeoutError(),
        "down": ClusterDownError("failing over"),
        "unconfirmed": NotReplicatedError([b"ISSUED", 6, 0, 1, *COUPON], 0),
        "paused": [b"PAUSED", 0, 0, 0],
    }
    presses = [(f"ev-{u}", u, f"k-{u}", "", True, None) for u in replies]

    async def alone() -> list[Any]:
        service = IssueService(_by_user(replies), SoldOutCache(ttl=60), holders=NOBODY)
        outcomes: list[Any] = []
        for event_id, user, key, tp, keyed, _ in presses:
            try:
                outcomes.append(
                    await service.issue(event_id, user, key, tp, keyed=keyed, budget_ms=2000)
                )
            except IssuerUnavailable as exc:
                outcomes.append(exc)
        return [service.unsettled.__contains__((p[0], p[1])) for p in presses], outcomes

    async def together() -> list[Any]:
        service = IssueService(_by_user(replies), SoldOutCache(ttl=60), holders=NOBODY)
        outcomes = await service.issue_many(presses, budget_ms=2000)
        return [service.unsettled.__contains__((p[0], p[1])) for p in presses], outcomes

    before = sample("flashcoupon_issuer_issuance_total", event="ev-won", outcome="ISSUED")
    unsettled_alone, one_by_one = asyncio.run(alone())
    unsettled_batch, batched = asyncio.run(together())
    assert [_summary(o) for o in batched] == [_summary(o) for o in one_by_one]
    assert [_summary(o)[0] for o in batched] == [
        "ISSUED", "DUPLICATE", "UNAVAILABLE", "UNAVAILABLE", "NOT_DURABLE", "PAUSED",
    ]  # fmt: skip
    assert unsettled_batch == unsettled_alone == [False, False, True, True, True, False]
    after = sample("flashcoupon_issuer_issuance_total", event="ev-won", outcome="ISSUED")
    assert after == before + 2  # once alone, once batched


def test_a_batch_answers_at_its_deadline_and_cancels_what_did_not_reply() -> None:
    """One event's call that never replies: the batch is answered at the caller's budget (the
    other event's presses with their outcomes, that event's 503) and its call is cancelled, so
    the batcher never sends it again."""
    from flashcoupon_issuer.issuance import IssuerUnavailable

    futures: list[asyncio.Future[Any]] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()

        def call(event_id: str, presses: Any, deadline: float | None) -> asyncio.Future[Any]:
            future: asyncio.Future[Any] = loop.create_future()
            if event_id == "ev-answered":
                future.set_result([[b"ISSUED", 3, 0, 1, *COUPON]])
            futures.append(future)
            return future

        service = IssueService(call, SoldOutCache(ttl=60), holders=NOBODY)
        started = loop.time()
        answered, silent = await service.issue_many(
            [("ev-answered", "a", "k1", "", True, None), ("ev-silent", "s", "k2", "", True, None)],
            budget_ms=100,
        )
        assert loop.time() - started < 1.0  # the 50 ms floor of call_budget, not 15 s
        assert not isinstance(answered, IssuerUnavailable) and answered.status == "ISSUED"
        assert isinstance(silent, IssuerUnavailable)
        assert futures[1].cancelled() and ("ev-silent", "s") in service.unsettled

    asyncio.run(scenario())


def test_a_batch_makes_one_call_per_event_and_answers_in_the_batch_order() -> None:
    """Presses of two events, interleaved: one script call each, carrying that event's presses
    in order (what one run of issue.lua takes); the answers come back in the batch's order."""
    calls: list[tuple[str, list[Any]]] = []

    async def call(event_id: str, presses: Any, deadline: float | None) -> list[Any]:
        calls.append((event_id, list(presses)))
        return [[b"ISSUED", n, 0, 1, *COUPON] for n, _ in enumerate(presses)]

    async def scenario() -> list[Any]:
        service = IssueService(call, SoldOutCache(ttl=60), holders=NOBODY)
        presses: list[Any] = [
            ("ev-x", "u0", "k0", "", True, None),
            ("ev-y", "u1", "k1", "tp1", True, (100_000, 5)),
            ("ev-x", "u2", "k2", "", True, None),
            ("ev-x", "u3", "k3", "", True, None),
        ]
        return await service.issue_many(presses)

    outcomes = asyncio.run(scenario())
    assert calls == [
        ("ev-x", [("u0", "k0", "", None), ("u2", "k2", "", None), ("u3", "k3", "", None)]),
        ("ev-y", [("u1", "k1", "tp1", (100_000, 5))]),
    ]
    assert [o.remaining for o in outcomes] == [0, 0, 1, 2]  # each press its own reply


def test_each_press_of_a_call_gets_its_own_reply_or_the_calls_error() -> None:
    """Unconfirmed writes (WAIT) carry each press's reply; a reply that is not one per press
    is an error for each rather than a coupon handed to the wrong shopper."""
    from flashcoupon_common.redis_batch import NotReplicatedError
    from flashcoupon_issuer.issuance import each_press
    from redis.exceptions import ResponseError

    assert each_press([b"r0", b"r1"], None, 2) == [(b"r0", None), (b"r1", None)]
    down = ConnectionError("gone")
    assert each_press(None, down, 2) == [(None, down), (None, down)]
    split = each_press(None, NotReplicatedError([b"r0", b"r1"], 0), 2)
    assert [(r, e.result, e.acked) for r, e in split] == [(None, b"r0", 0), (None, b"r1", 0)]
    for wrong in ([b"r0"], b"r0", None):
        got = each_press(wrong, None, 2)
        assert len(got) == 2 and all(isinstance(e, ResponseError) for _, e in got)
    short = each_press(None, NotReplicatedError([b"r0"], 0), 2)
    assert all(isinstance(e, ResponseError) for _, e in short)


def test_a_batch_after_the_sell_out_loads_holders_once_and_counts_each_press_once() -> None:
    """Known sold out: one holders load for the batch; non-holders answered locally (counted
    once each), a keyed replay from the cache, the holder sent to the script."""
    calls: list[tuple[Any, ...]] = []
    loads: list[str] = []

    async def script(*args: Any) -> list[Any]:
        calls.append(args)
        return [b"DUPLICATE", -1, 0, 1, *COUPON]

    async def holders(event_id: str) -> frozenset[str]:
        loads.append(event_id)
        return frozenset({"held", "keyed"})

    async def scenario() -> None:
        service = IssueService(per_press(script), SoldOutCache(ttl=60), holders=Holders(holders))
        service.replays.put("ev-h", "keyed", "k1", [b"ISSUED", 0, 0, 1, *COUPON])
        service.learn_sold_out("ev-h")
        local_before = sample("flashcoupon_issuer_sold_out_local_total", event="ev-h")
        presses: list[Any] = [("ev-h", f"u{i}", "r", "", False, None) for i in range(5)]
        presses += [
            ("ev-h", "keyed", "k1", "", True, None),
            ("ev-h", "held", "r2", "", False, None),
        ]
        outcomes = await service.issue_many(presses)
        assert [_summary(o)[0] for o in outcomes] == ["SOLD_OUT"] * 5 + ["ISSUED", "DUPLICATE"]
        assert outcomes[5].replay  # type: ignore[union-attr]
        assert loads == ["ev-h"] and [c[1] for c in calls] == ["held"]
        local = sample("flashcoupon_issuer_sold_out_local_total", event="ev-h")
        assert local == local_before + 5

    asyncio.run(scenario())


def test_the_allowance_ends_a_reply_that_asked_for_it() -> None:
    """issue.lua appends (left, reset us) to the reply of a press whose allowance it decided;
    LIMITED carries the retry-after where other replies carry the stock."""
    from flashcoupon_issuer.issuance import Allowance

    issued = parse_reply([b"ISSUED", 41, 0, 1, *COUPON, 4, 500_000])
    assert issued.status == "ISSUED" and issued.remaining == 41
    assert issued.coupons[0].code == "ABCD0123456789"
    assert issued.allowance == Allowance(4, 500_000, 0)
    assert parse_reply([b"ISSUED", 41, 0, 1, *COUPON]).allowance is None
    duplicate = parse_reply([b"DUPLICATE", -1, 0, 2, *COUPON, *COUPON, 0, 2_000_000])
    assert len(duplicate.coupons) == 2 and duplicate.allowance == Allowance(0, 2_000_000, 0)
    limited = parse_reply([b"LIMITED", 300_000, 0, 0, 0, 2_300_000])
    assert limited.status == "LIMITED" and limited.remaining is None and not limited.coupons
    assert limited.allowance == Allowance(0, 2_300_000, 300_000)
    assert parse_reply([b"NOT_STARTED", 5000, 0, 0, 3, 10]).at_ms == 5000
