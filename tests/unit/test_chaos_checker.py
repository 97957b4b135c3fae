"""The chaos checker finds each planted fault (loadtest/.../chaos/checker.py)."""

from __future__ import annotations

from flashcoupon_loadtest.chaos.checker import caught_up, false_sold_out, judge
from flashcoupon_loadtest.chaos.workload import Answer
from flashcoupon_loadtest.invariants import Holding


def ans(
    user: str,
    status: int,
    *,
    code: str | None = None,
    coupon: str | None = None,
    sent: float = 1.0,
    latency: float = 0.01,
    phase: str = "burst",
) -> Answer:
    return Answer(user, phase, False, sent, latency, status, code, coupon, 0)


def held(*pairs: tuple[str, str]) -> list[Holding]:
    return [Holding(u, 1, c, "all") for u, c in pairs]


def run(answers: list[Answer], redis: list[Holding], mysql: list[Holding], **kw: object):
    args = {
        "issued": len(redis),
        "quantity": 2,
        "per_user_limit": 1,
        "samples": [],
        "fault": (0.5, 2.0),
    }
    args.update(kw)
    return judge(answers, redis=redis, mysql=mysql, **args)  # type: ignore[arg-type]


def test_clean_run_passes() -> None:
    stores = held(("a", "C1"), ("b", "C2"))
    answers = [
        ans("a", 201, coupon="C1"),
        ans("b", 201, coupon="C2"),
        ans("b", 409, code="DUPLICATE", coupon="C2"),
        ans("c", 410, code="SOLD_OUT"),
    ]
    f = run(answers, stores, stores)
    assert f.failures() == [] and f.acknowledged == 2 and f.statuses["201"] == 2


def test_lost_acknowledged_and_lost_in_pipeline() -> None:
    f = run([ans("a", 201, coupon="C1")], held(("a", "C1"), ("b", "C2")), [])
    assert f.lost == 2 and f.failures() == ["lost"]


def test_duplicates_oversold_and_mismatch() -> None:
    redis = held(("a", "C1"), ("b", "C1"), ("c", "C3"))
    mysql = held(("a", "C1"), ("d", "C4"))
    f = run([], redis, mysql, issued=3)
    assert f.duplicated >= 1 and f.oversold == 1 and f.mismatch == 1
    assert set(f.failures()) >= {"duplicated", "oversold", "mismatch"}
    assert f.failures(allowed=("duplicated", "oversold", "mismatch", "lost")) == []


def test_503_not_revealed_on_retry_is_wrong() -> None:
    stores = held(("a", "C1"))
    answers = [
        ans("a", 503, code="SERVICE_UNAVAILABLE"),
        ans("a", 410, code="SOLD_OUT", sent=5, phase="retry"),
    ]
    f = run(answers, stores, stores, quantity=1)
    assert f.wrong == {"unrevealed_503": 1}
    revealed = [answers[0], ans("a", 409, code="DUPLICATE", coupon="C1", sent=5, phase="retry")]
    assert run(revealed, stores, stores, quantity=1).wrong == {}


def test_other_5xx_unexpected_status_and_wrong_coupon() -> None:
    stores = held(("a", "C1"), ("b", "C2"))
    answers = [
        ans("x", 502, code="BAD_UPSTREAM"),
        ans("y", 404, code="EVENT_NOT_FOUND"),
        ans("z", 409, code="ENDED"),
        ans("b", 409, code="DUPLICATE", coupon="C1"),
    ]
    f = run(answers, stores, stores)
    assert f.wrong == {"other_5xx": 1, "unexpected_status": 2, "wrong_coupon": 1}


def test_a_201_whose_code_went_to_another_shopper_is_lost_not_also_wrong() -> None:
    """Durability `none`: a master that lost the write lets the script issue the same code
    again (documented). The first shopper's 201 is lost — one category, so `none` may allow it."""
    stores = held(("b", "C1"))
    f = run([ans("a", 201, coupon="C1"), ans("b", 201, coupon="C1", sent=2)], stores, stores)
    assert f.lost == 1 and f.wrong == {}
    assert f.failures(allowed=("lost", "duplicated", "mismatch")) == []


def test_false_sold_out_uses_only_later_samples_below_quantity() -> None:
    early = ans("a", 410, code="SOLD_OUT", sent=1.0)
    late = ans("b", 410, code="SOLD_OUT", sent=3.0)
    samples = [(0.5, 0), (2.0, 1), (2.5, 2), (4.0, 2)]
    assert false_sold_out([early, late], samples, quantity=2) == [early]
    # after the counter went backwards (a master lost writes) samples prove nothing
    assert false_sold_out([late], [(0.5, 1), (3.5, 0)], quantity=2) == []


def test_latency_and_recovery_figures() -> None:
    answers = [
        ans("a", 201, coupon="C1", sent=0.1),
        ans("b", 503, sent=1.0, latency=1.5),
        ans("c", 503, sent=2.5, latency=0.5),
        ans("d", 410, code="SOLD_OUT", sent=4.0),
    ]
    f = run(answers, held(("a", "C1")), held(("a", "C1")), quantity=1)
    assert f.p99_fault_ms == 1500.0 and f.recovery_s == 1.0


def test_caught_up() -> None:
    issued = [(1.0, 10), (2.0, 20), (3.0, 30)]
    assert caught_up(issued, [(2.5, 5), (3.5, 20), (4.0, 30)], end=2.0) == 1.5
    assert caught_up(issued, [(2.5, 5)], end=2.0) is None


def test_a_holder_told_their_coupon_before_a_503_is_not_unrevealed() -> None:
    stores = held(("a", "C1"))
    answers = [
        ans("a", 201, coupon="C1", sent=0.5),
        ans("a", 503, sent=1.0),
        ans("a", 410, code="SOLD_OUT", sent=5, phase="retry"),
    ]
    assert run(answers, stores, stores, quantity=1).wrong == {}
