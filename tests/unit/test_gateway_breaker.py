"""The circuit breaker's state machine."""

from __future__ import annotations

from flashcoupon_gateway.breaker import Breaker, State, retry_after_header


def test_opens_after_consecutive_failures_only() -> None:
    b = Breaker(failure_threshold=3, open_seconds=5)
    b.on_failure(0)
    b.on_failure(0)
    b.on_success()  # not consecutive: counting starts again
    b.on_failure(0)
    b.on_failure(0)
    assert b.state is State.CLOSED and b.try_acquire(0)
    b.on_failure(1)
    assert b.state is State.OPEN
    assert not b.try_acquire(2)
    assert b.retry_after(2) == 4


def test_half_open_lets_one_probe_through_and_closes_on_success() -> None:
    b = Breaker(failure_threshold=1, open_seconds=5)
    b.on_failure(0)
    assert not b.try_acquire(4.9)
    assert b.try_acquire(5.0)  # the probe
    assert b.state is State.HALF_OPEN
    assert not b.try_acquire(5.1)  # only one probe at a time
    assert b.retry_after(5.1) > 0
    b.on_success()
    assert b.state is State.CLOSED and b.try_acquire(5.2)


def test_failed_probe_reopens_for_a_full_period() -> None:
    b = Breaker(failure_threshold=1, open_seconds=5)
    b.on_failure(0)
    assert b.try_acquire(6)
    b.on_failure(6)
    assert b.state is State.OPEN
    assert not b.try_acquire(10)
    assert b.try_acquire(11)


def test_abandoned_probe_frees_the_slot() -> None:
    b = Breaker(failure_threshold=1, open_seconds=1)
    b.on_failure(0)
    assert b.try_acquire(2)
    b.on_abandoned()
    assert b.try_acquire(2)


def test_retry_after_header_is_whole_seconds_at_least_one() -> None:
    assert retry_after_header(0) == "1"
    assert retry_after_header(0.2) == "1"
    assert retry_after_header(4.01) == "5"


def test_which_answers_count_as_breaker_failures() -> None:
    """Issue 10 item 5: the issuer's 503s during a Redis failover opened the gateway's breakers,
    so shoppers got breaker_open after Redis was back. A 503 is an answer, not a failure."""
    from flashcoupon_gateway.breaker import Verdict, verdict

    assert verdict(503) is Verdict.NEUTRAL
    for status in (500, 502, 504):
        assert verdict(status) is Verdict.FAILURE
    for status in (200, 201, 404, 409, 410, 423, 429):
        assert verdict(status) is Verdict.SUCCESS
