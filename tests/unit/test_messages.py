from __future__ import annotations

from dataclasses import replace

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


def as_redis(fields: dict[str, str]) -> dict[bytes, bytes]:
    return {k.encode(): v.encode() for k, v in fields.items()}


TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize("traceparent", ["", TP])
def test_outbox_entry_round_trip(traceparent: str) -> None:
    rec = sample()
    fields = rec.to_outbox(traceparent)
    assert list(fields) == [CouponIssued.OUTBOX_FIELD]
    assert CouponIssued.read_outbox(as_redis(fields)) == (rec, traceparent)
    assert CouponIssued.from_outbox(as_redis(fields)) == rec


def legacy_entry(rec: CouponIssued) -> dict[str, str]:
    """An entry as issue.lua wrote it before the one-field shape: a field per value."""
    d = rec.discount
    values = [rec.event_id, rec.user_id, str(rec.seq), rec.code, rec.tier, d.type]
    values += ["" if v is None else str(v) for v in (d.amount, d.percent, d.max_amount)]
    values += [str(rec.issued_at_ms), str(rec.expires_at_ms), rec.request_id]
    return dict(zip(CouponIssued.LEGACY_OUTBOX_FIELDS, values, strict=True))


def test_outbox_entries_of_the_earlier_shape_are_still_read() -> None:
    # A stream may still hold them while a rollout replaces the issuers' script.
    rec = replace(sample(), discount=Discount("fixed", amount=10_000))
    assert CouponIssued.read_outbox(as_redis(legacy_entry(rec))) == (rec, "")
    with_tp = as_redis({**legacy_entry(rec), "tp": TP})
    assert CouponIssued.read_outbox(with_tp) == (rec, TP)


def test_a_user_id_holding_the_separator_is_read_whole() -> None:
    # The user id is the one free-text value, so it goes last and keeps whatever it holds.
    rec = replace(sample(), user_id="odd\x1fuser\x1f")
    fields = as_redis(rec.to_outbox(TP))
    assert CouponIssued.read_outbox(fields) == (rec, TP)


def _packed(values: list[str]) -> dict[bytes, bytes]:
    return {b"v": "\x1f".join(values).encode()}


GOOD = sample().to_outbox()["v"].split("\x1f")


@pytest.mark.parametrize(
    "fields",
    [
        _packed(GOOD[:-2]),  # values missing
        _packed(["ev", "1"]),
        _packed([*GOOD[:4], "gift", *GOOD[5:]]),  # no such discount type
        _packed([GOOD[0], "x", *GOOD[2:]]),  # the user's n-th coupon not a number
        _packed([*GOOD[:8], "soon", *GOOD[9:]]),  # issued at not a number
        {b"v": b"\xff\xfe"},  # not UTF-8
        {b"e": b"ev1", b"u": b"\xff\xfe"},  # the earlier shape, values missing
    ],
)
def test_malformed_outbox_entries_raise_schema_error(fields: dict[bytes, bytes]) -> None:
    with pytest.raises(SchemaError):
        CouponIssued.read_outbox(fields)


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
