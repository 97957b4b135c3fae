from __future__ import annotations

from datetime import UTC, datetime

import pytest
from flashcoupon_common.event_spec import EventSpec, TierSpec
from flashcoupon_common.messages import Discount

FIXED = Discount("fixed", amount=1000)


def spec(quantity: int, shares: list[int]) -> EventSpec:
    tiers = tuple(TierSpec(f"t{i}", FIXED, s) for i, s in enumerate(shares))
    now = datetime(2026, 11, 27, tzinfo=UTC)
    return EventSpec("ev", "t", quantity, now, now, tiers)


@pytest.mark.parametrize(
    ("quantity", "shares", "expected"),
    [
        (10_000, [10, 90], {"t0": 1_000, "t1": 9_000}),
        (10, [33, 33, 34], {"t0": 3, "t1": 3, "t2": 4}),
        (1, [50, 50], {"t0": 1, "t1": 0}),  # tie: earlier tier wins
        (7, [100], {"t0": 7}),
        (101, [1, 1, 98], {"t0": 1, "t1": 1, "t2": 99}),
    ],
)
def test_tier_quantities_are_exact(
    quantity: int, shares: list[int], expected: dict[str, int]
) -> None:
    counts = spec(quantity, shares).tier_quantities()
    assert counts == expected
    assert sum(counts.values()) == quantity


def test_json_round_trip_keeps_every_field() -> None:
    from datetime import timedelta

    from flashcoupon_common.event_spec import AdmissionSpec

    s = EventSpec(
        "bf-2026",
        "Black Friday",
        10_000,
        datetime(2026, 11, 27, 5, tzinfo=UTC),
        datetime(2026, 11, 27, 14, 59, 59, tzinfo=UTC),
        (
            TierSpec("big", FIXED, 10),
            TierSpec("small", Discount("percent", percent=5, max_amount=3000), 90),
        ),
        per_user_limit=3,
        warmup=timedelta(minutes=5),
        valid_for=timedelta(hours=1),
        admission=AdmissionSpec(50_000, 2.0, 5, True, 2000),
    )
    assert EventSpec.from_json(s.to_json()) == s
