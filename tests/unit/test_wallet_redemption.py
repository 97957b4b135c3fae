from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from flashcoupon_common.http import ProblemError
from flashcoupon_common.messages import Discount
from flashcoupon_common.settings import SettingsError
from flashcoupon_wallet.redemption import (
    AlreadyRedeemed,
    CouponNotFound,
    CouponRow,
    Expired,
    NotYourCoupon,
    RedeemRequest,
    display_status,
    explain_miss,
    iso_utc,
    parse_request,
    plan,
)
from flashcoupon_wallet.settings import WalletSettings

from tests.support.env import LOCAL

NOW = datetime(2026, 11, 27, 5, 0, 0, 123456, tzinfo=UTC)


def row(**over: object) -> CouponRow:
    base: dict[str, object] = {
        "event_id": "bf",
        "user_id": "alice",
        "code": "C0DE",
        "tier": "big",
        "discount": Discount("fixed", amount=10_000),
        "status": "issued",
        "issued_at": datetime(2026, 11, 27, 5, 0),
        "expires_at": datetime(2026, 12, 27, 5, 0),
        "expired": False,
    }
    base.update(over)
    return CouponRow(**base)  # type: ignore[arg-type]


def redeemed_row(order_id: str = "o-1", amount: int = 50_000) -> CouponRow:
    return row(
        status="redeemed",
        order_id=order_id,
        order_amount=amount,
        discount_amount=10_000,
        redeemed_at=datetime(2026, 11, 27, 6, 0, 0, 500000),
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "orderId is required"),
        ({"orderId": 7, "orderAmount": 10}, "orderId must be a string of 1-64 printable"),
        ({"orderId": "  ", "orderAmount": 10}, "not only spaces"),
        ({"orderId": "x" * 65, "orderAmount": 10}, "1-64"),
        ({"orderId": "a\u0000b", "orderAmount": 10}, "no control characters"),
        ({"orderId": "o"}, "orderAmount is required"),
        ({"orderId": "o", "orderAmount": "10"}, "must be an integer from 1 to"),
        ({"orderId": "o", "orderAmount": 10.5}, "must be an integer from 1 to"),
        ({"orderId": "o", "orderAmount": True}, "must be an integer from 1 to"),
        ({"orderId": "o", "orderAmount": 0}, "must be an integer from 1 to"),
        ({"orderId": "o", "orderAmount": -5}, "must be an integer from 1 to"),
        ({"orderId": "o", "orderAmount": 2**60}, "from 1 to 9007199254740991"),
    ],
)
def test_bad_bodies_are_rejected_with_a_message_naming_the_field(
    body: dict[str, object], message: str
) -> None:
    with pytest.raises(ProblemError, match=message) as err:
        parse_request(body)
    assert err.value.status == 422 and err.value.code == "INVALID_REQUEST"


def test_a_good_body_parses() -> None:
    assert parse_request({"orderId": "o-1", "orderAmount": 50_000}) == RedeemRequest("o-1", 50_000)


@pytest.mark.parametrize(
    ("discount", "order", "expected"),
    [
        (Discount("fixed", amount=10_000), 50_000, 10_000),
        (Discount("fixed", amount=10_000), 4_000, 4_000),  # never more than the order
        (Discount("percent", percent=5, max_amount=3_000), 20_000, 1_000),
        (Discount("percent", percent=5, max_amount=3_000), 1_000_000, 3_000),  # capped
        (Discount("percent", percent=10), 999, 99),  # floor
    ],
)
def test_plan_applies_the_tier_discount(discount: Discount, order: int, expected: int) -> None:
    r = plan(row(discount=discount), RedeemRequest("o-1", order), NOW)
    assert r.discount_amount == expected
    assert r.pay_amount == order - expected
    assert r.redeemed_at.microsecond == 123000  # DATETIME(3) precision, so replays match


def test_miss_on_unknown_code_is_404_and_on_someone_elses_is_403() -> None:
    req = RedeemRequest("o-1", 50_000)
    with pytest.raises(CouponNotFound):
        explain_miss(None, "alice", req)
    with pytest.raises(NotYourCoupon):
        explain_miss(row(), "mallory", req)
    # ownership is checked before status: a stranger learns nothing about the order
    with pytest.raises(NotYourCoupon):
        explain_miss(redeemed_row(), "mallory", req)


def test_replay_with_same_order_returns_the_stored_answer() -> None:
    answer = explain_miss(redeemed_row(), "alice", RedeemRequest("o-1", 50_000))
    assert answer is not None
    assert answer.to_json() == {
        "couponCode": "C0DE",
        "orderId": "o-1",
        "orderAmount": 50_000,
        "discountAmount": 10_000,
        "payAmount": 40_000,
        "redeemedAt": "2026-11-27T06:00:00.500Z",
    }


def test_other_order_or_changed_amount_is_already_redeemed() -> None:
    with pytest.raises(AlreadyRedeemed, match="o-1"):
        explain_miss(redeemed_row(), "alice", RedeemRequest("o-2", 50_000))
    with pytest.raises(AlreadyRedeemed, match="orderAmount 50000"):
        explain_miss(redeemed_row(), "alice", RedeemRequest("o-1", 60_000))


def test_expired_by_clock_or_status_is_410() -> None:
    req = RedeemRequest("o-1", 50_000)
    with pytest.raises(Expired, match=r"2026-12-27T05:00:00\.000Z"):
        explain_miss(row(expired=True), "alice", req)
    with pytest.raises(Expired):
        explain_miss(row(status="expired"), "alice", req)


def test_a_row_that_still_looks_redeemable_asks_for_another_try() -> None:
    assert explain_miss(row(), "alice", RedeemRequest("o-1", 50_000)) is None


def test_display_status_shows_lapsed_coupons_as_expired() -> None:
    assert display_status(row()) == "issued"
    assert display_status(row(expired=True)) == "expired"
    assert display_status(redeemed_row()) == "redeemed"


def test_iso_utc_treats_naive_as_utc() -> None:
    assert iso_utc(datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05.000Z"
    seoul = datetime(2026, 1, 2, 21, 4, 5, tzinfo=timezone(timedelta(hours=9)))
    assert iso_utc(seoul) == "2026-01-02T12:04:05.000Z"


def test_settings_from_env_validate_and_name_the_variable() -> None:
    s = WalletSettings.from_env({**LOCAL, "FLASHCOUPON_WALLET_PORT": "9999"})
    assert s.port == 9999 and s.redeemed_topic == "coupon-redeemed"
    with pytest.raises(SettingsError, match="FLASHCOUPON_WALLET_PORT"):
        WalletSettings.from_env({**LOCAL, "FLASHCOUPON_WALLET_PORT": "x"})
    with pytest.raises(SettingsError, match="FLASHCOUPON_WALLET_DB_POOL_SIZE"):
        WalletSettings.from_env({**LOCAL, "FLASHCOUPON_WALLET_DB_POOL_SIZE": "0"})
