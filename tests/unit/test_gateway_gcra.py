"""GCRA maths (mirrored by lua/ratelimit.lua), the deny cache and the rate headers."""

from __future__ import annotations

from flashcoupon_gateway import gcra
from flashcoupon_gateway.ratelimit import (
    Check,
    Outcome,
    event_shard_key,
    event_shard_limit,
    rate_headers,
    rate_limited,
)

S = gcra.MICROS


def run(limit: gcra.Limit, times_us: list[int]) -> list[bool]:
    tat: int | None = None
    out = []
    for now in times_us:
        d = gcra.decide(tat, now, limit)
        if d.allowed:
            tat = d.new_tat
        out.append(d.allowed)
    return out


def test_burst_then_steady_rate() -> None:
    limit = gcra.Limit(per_second=10, burst=5)
    # 8 requests at the same instant: exactly the burst passes.
    assert run(limit, [0] * 8) == [True] * 5 + [False] * 3


def test_sustained_rate_is_exact_over_a_long_window() -> None:
    limit = gcra.Limit(per_second=100, burst=10)
    # 1,000 requests per second for 10 s: admitted = burst + rate * duration.
    times = [i * 1000 for i in range(10_000)]
    assert sum(run(limit, times)) == 10 + 100 * 10 - 1 or sum(run(limit, times)) == 10 + 100 * 10


def test_rejection_does_not_move_tat_and_retry_after_is_exact() -> None:
    limit = gcra.Limit(per_second=2, burst=1)
    first = gcra.decide(None, 0, limit)
    assert first.allowed and first.new_tat == S // 2
    second = gcra.decide(first.new_tat, 0, limit)
    assert not second.allowed and second.new_tat is None
    assert second.retry_after_us == S // 2
    # At exactly the retry time the request conforms.
    assert gcra.decide(first.new_tat, second.retry_after_us, limit).allowed


def test_remaining_and_reset() -> None:
    limit = gcra.Limit(per_second=10, burst=5)
    d = gcra.decide(None, 0, limit)
    assert d.remaining == 4 and d.reset_us == S // 10
    for _ in range(4):
        d = gcra.decide(d.new_tat, 0, limit)
    assert d.remaining == 0 and d.reset_us == S // 2


def test_idle_time_refills_up_to_the_burst_only() -> None:
    limit = gcra.Limit(per_second=10, burst=3)
    assert run(limit, [0, 0, 0, 100 * S, 100 * S, 100 * S, 100 * S]) == [
        True, True, True, True, True, True, False,
    ]  # fmt: skip


def test_retry_after_seconds_rounds_up() -> None:
    assert gcra.retry_after_seconds(1) == 1
    assert gcra.retry_after_seconds(S) == 1
    assert gcra.retry_after_seconds(S + 1) == 2


def test_deny_cache_expires() -> None:
    cache = gcra.DenyCache()
    cache.block("k", 0.5, now=100.0)
    assert cache.blocked_for("k", now=100.2) > 0.29
    assert cache.blocked_for("k", now=100.6) == 0.0
    assert cache.blocked_for("other", now=100.0) == 0.0


def test_event_shards_split_the_rate_and_keep_distinct_hash_tags() -> None:
    limit = event_shard_limit(1000, 8)
    assert limit.per_second * 8 == 1000
    assert limit.burst * 8 >= 100  # ~100 ms of the cap in total
    keys = {event_shard_key("ev", i) for i in range(8)}
    assert len(keys) == 8 and all(k.startswith("{rl:ev:ev:") for k in keys)


def test_rate_limited_problem_and_headers() -> None:
    check = Check("user", "{rl:u:alice}:api", gcra.Limit(2, 5))
    exc = rate_limited(Outcome(check, False, 1_200_000, 0, 2_500_000))
    assert exc.status == 429 and exc.code == "RATE_LIMITED"
    assert exc.headers["Retry-After"] == "2"
    assert exc.headers["RateLimit-Limit"] == "5"
    assert exc.headers["RateLimit-Remaining"] == "0"
    assert exc.headers["RateLimit-Reset"] == "3"
    assert exc.extra["scope"] == "user"
    ok = rate_headers([Outcome(check, True, 0, 3, 1_000_000), Outcome(check, True, 0, 1, 0)])
    assert dict(ok)[b"ratelimit-remaining"] == b"1"


def test_want_grants_as_many_as_conform() -> None:
    limit = gcra.Limit(per_second=10, burst=8)
    d = gcra.decide(None, 0, limit, want=5)
    assert d.granted == 5 and d.remaining == 3
    d2 = gcra.decide(d.new_tat, 0, limit, want=5)
    assert d2.granted == 3 and d2.remaining == 0  # only what is left
    d3 = gcra.decide(d2.new_tat, 0, limit, want=5)
    assert d3.granted == 0 and d3.retry_after_us == S // 10


def test_lease_size_is_bounded_by_demand_burst_and_time() -> None:
    from flashcoupon_gateway.ratelimit import lease_size

    assert lease_size(gcra.Limit(2, 5), 1000) == 1  # a shopper's limit: always exact
    assert lease_size(gcra.Limit(1000, 400), 3) == 3  # no more than local demand
    assert lease_size(gcra.Limit(1000, 400), 1000) == 100  # 100 ms of the rate
    assert lease_size(gcra.Limit(100_000, 200), 10_000) == 50  # a quarter of the burst


def test_the_issuer_decides_the_shoppers_limit_only_when_nothing_after_it_depends_on_it() -> None:
    """carries_allowance: the issue script decides the per-user limit for a known event
    without a waiting room or an event cap; otherwise the gateway asks its limiter first."""
    import dataclasses

    from flashcoupon_common.event_spec import AdmissionSpec
    from flashcoupon_gateway.admission import EventInfo
    from flashcoupon_gateway.service import carries_allowance

    from tests.support.issuer import make_spec

    def info(**admission: object) -> EventInfo:
        spec = make_spec(10)
        return EventInfo(dataclasses.replace(spec, admission=AdmissionSpec(**admission)))  # type: ignore[arg-type]

    assert carries_allowance(info())
    assert not carries_allowance(EventInfo(None))
    assert not carries_allowance(info(waiting_room_enabled=True))
    assert not carries_allowance(info(max_per_second=100))


def test_an_allowance_the_issuer_refused_is_remembered_and_answered_as_the_limiter_would() -> None:
    """The issuer's word on the shopper's allowance becomes the same Outcome, 429 and deny-cache
    entry as a limiter call's: the next press is refused here, without a call."""
    import time

    import pytest
    from flashcoupon_common.http import ProblemError
    from flashcoupon_gateway.ratelimit import Check, RateLimiter, user_key

    limiter = RateLimiter(None, event_shards=1)  # type: ignore[arg-type]  # no call is made
    check = Check("user", user_key("ann", "ev:e"), gcra.Limit(2.0, 5))
    ok = limiter.allowance_outcome(check, (3, 1_000_000, 0), time.monotonic())
    assert ok.allowed and ok.remaining == 3
    assert dict(rate_headers([ok]))[b"ratelimit-remaining"] == b"3"
    with pytest.raises(ProblemError) as refused:
        limiter.allowance_outcome(check, (0, 2_500_000, 1_500_000), time.monotonic())
    assert refused.value.status == 429 and refused.value.extra["scope"] == "user"
    assert refused.value.headers["Retry-After"] == "2"
    with pytest.raises(ProblemError) as local:
        limiter.refuse_if_denied(check)
    assert local.value.status == 429


def test_a_limit_is_made_once_and_names_its_keys() -> None:
    """A press's limits come from gcra.limit: the same parameters give the same Limit, whose
    interval and key suffix are computed once; a key kept under other parameters differs."""
    a = gcra.limit(10.0, 20)
    assert a is gcra.limit(10.0, 20) and a == gcra.Limit(10.0, 20)
    assert (a.interval_us, a.signature) == (100_000, ":100000:20")
    assert gcra.Limit(3e6, 1).interval_us == 1  # never below a microsecond
    assert Check("ip", "{rl:ip:1.2.3.4}", a).key == "{rl:ip:1.2.3.4}:100000:20"
    assert (
        Check("ip", "{rl:ip:1.2.3.4}", gcra.limit(10.0, 21)).key
        != Check("ip", "{rl:ip:1.2.3.4}", a).key
    )


def test_rate_headers_name_the_tightest_outcome_with_its_limit() -> None:
    """RateLimit-* for the most constraining outcome (a refusal first, then the fewest left):
    its limit's burst and window (burst / rate, at least 1 s), its reset rounded up to whole
    seconds, exactly at the boundary too."""
    ip = Check("ip", "{rl:ip:1.2.3.4}", gcra.limit(1000.0, 2000))
    user = Check("user", "{rl:u:ann}:ev:e", gcra.limit(0.5, 3))
    roomy, tight = Outcome(ip, True, 0, 1500, 2_000_001), Outcome(user, True, 0, 2, 2_000_000)
    assert rate_headers([roomy, tight]) == [
        (b"ratelimit-limit", b"3"),
        (b"ratelimit-remaining", b"2"),
        (b"ratelimit-reset", b"2"),
        (b"ratelimit-policy", b"3;w=6"),
    ]
    refused = Outcome(ip, False, 5_000, 0, 1)
    assert rate_headers([tight, refused]) == [
        (b"ratelimit-limit", b"2000"),
        (b"ratelimit-remaining", b"0"),
        (b"ratelimit-reset", b"1"),
        (b"ratelimit-policy", b"2000;w=2"),
    ]
    assert dict(rate_headers([roomy]))[b"ratelimit-reset"] == b"3"
    assert rate_headers([]) == []
    # A 429 names the same headers, with their canonical names, and its Retry-After.
    assert rate_limited(refused).headers == {
        "RateLimit-Limit": "2000",
        "RateLimit-Remaining": "0",
        "RateLimit-Reset": "1",
        "RateLimit-Policy": "2000;w=2",
        "Retry-After": "1",
    }
