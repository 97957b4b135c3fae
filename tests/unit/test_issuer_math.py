"""Supply caps on (re-)provision, phases and window checks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from flashcoupon_common.coupon_math import phase, tier_caps, window_status
from flashcoupon_common.event_spec import EventSpec, TierSpec
from flashcoupon_common.event_state import ProvisionError, validate_spec
from flashcoupon_common.messages import Discount


def test_caps_are_the_targets_when_nothing_issued() -> None:
    assert tier_caps([10, 90], [0, 0], 100) == [10, 90]


def test_raise_keeps_exact_targets() -> None:
    assert tier_caps([20, 180], [7, 60], 200) == [20, 180]


def test_alabama_paradox_keeps_issued_and_sum() -> None:
    # target of tier 0 shrank below what it already issued: cap stays at issued, the surplus
    # comes off the tier with the most room, and the caps still sum to the quantity.
    caps = tier_caps([4, 4, 3], [5, 0, 0], 11)
    assert caps[0] == 5 and sum(caps) == 11 and all(c >= 0 for c in caps)


def test_lowering_below_issued_is_refused() -> None:
    with pytest.raises(ValueError, match="below"):
        tier_caps([5, 5], [6, 5], 10)


def test_phase() -> None:
    kw = {"start_ms": 100, "end_ms": 200}
    assert phase(50, remaining=5, **kw) == "Ready"
    assert phase(150, remaining=5, **kw) == "Active"
    assert phase(150, remaining=0, **kw) == "SoldOut"
    assert phase(200, remaining=5, **kw) == "Ended"
    # Paused is not a phase (docs/couponctl.md): the function cannot even be told about it.
    with pytest.raises(TypeError):
        phase(150, paused=True, remaining=5, **kw)  # type: ignore[call-arg]


def test_window_status_is_half_open() -> None:
    assert window_status(99, 100, 200) == "NOT_STARTED"
    assert window_status(100, 100, 200) is None
    assert window_status(199, 100, 200) is None
    assert window_status(200, 100, 200) == "ENDED"


def _spec(**kw: object) -> EventSpec:
    now = datetime.now(UTC)
    base: dict[str, object] = {
        "event_id": "ev-1",
        "title": "t",
        "quantity": 10,
        "start_at": now,
        "end_at": now + timedelta(hours=1),
        "tiers": (TierSpec("a", Discount("fixed", amount=1), 100),),
    }
    base.update(kw)
    return EventSpec(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"event_id": "Bad_Id"}, "DNS-1123"),
        ({"quantity": 0}, "quantity"),
        ({"tiers": (TierSpec("a", Discount("fixed", amount=1), 50),)}, "sum to 100"),
        ({"end_at": datetime(2000, 1, 1, tzinfo=UTC)}, "endAt"),
        ({"per_user_limit": 0}, "perUserLimit"),
        ({"tiers": (TierSpec("Gold Tier", Discount("fixed", amount=1), 100),)}, "tier name"),
        ({"tiers": (TierSpec("a\x1fb", Discount("fixed", amount=1), 100),)}, "DNS-1123"),
    ],
)
def test_validate_spec_names_the_problem(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ProvisionError, match=message):
        validate_spec(_spec(**kw))
