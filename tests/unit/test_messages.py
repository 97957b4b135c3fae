from __future__ import annotations

import pytest
from flashcoupon_common.messages import CouponIssued, Discount, SchemaError


def sample() -> CouponIssued:
    return CouponIssued(
        event_id="bf-2026",
        user_id="u-1",
        seq=1,
        code="K7QX2M9PA4TZ",
        tier="small",
        discount=Discount("percent", percent=5, max_amount=3000),
        issued_at_ms=1_700_000_000_000,
        expires_at_ms=1_700_000_360_000,
        request_id="r-1",
    )


def test_outbox_fields_round_trip() -> None:
    rec = sample()
    fields = rec.to_outbox()
    assert set(fields) == set(CouponIssued.OUTBOX_FIELDS)
    raw = {k.encode(): v.encode() for k, v in fields.items()}  # as redis returns them
    assert CouponIssued.from_outbox(raw) == rec


def test_kafka_value_round_trip_and_key() -> None:
    rec = sample()
    assert CouponIssued.decode(rec.encode()) == rec
    assert rec.kafka_key() == b"u-1"


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'{"v": 2, "type": "coupon.issued"}',
        b'{"v": 1, "type": "coupon.issued"}',
    ],
)
def test_undecodable_values_raise_schema_error(raw: bytes) -> None:
    with pytest.raises(SchemaError):
        CouponIssued.decode(raw)


@pytest.mark.parametrize(
    ("discount", "order", "expected"),
    [
        (Discount("fixed", amount=10_000), 50_000, 10_000),
        (Discount("fixed", amount=10_000), 4_000, 4_000),  # never more than the order
        (Discount("percent", percent=5, max_amount=3_000), 40_000, 2_000),
        (Discount("percent", percent=5, max_amount=3_000), 100_000, 3_000),  # capped
        (Discount("percent", percent=10), 12_345, 1_234),
    ],
)
def test_discount_apply(discount: Discount, order: int, expected: int) -> None:
    assert discount.apply(order) == expected
