"""Plain decisions of the persister: duplicate vs conflict, backoff, stalls, decoding, DLQ."""

from __future__ import annotations

import dataclasses

import pytest
from aiokafka.structs import ConsumerRecord
from flashcoupon_common.messages import CouponIssued, Discount
from flashcoupon_common.settings import KafkaSettings, MysqlSettings, SettingsError
from flashcoupon_persister.consumer import STALL_GRACE_S, decode_all, is_stalled
from flashcoupon_persister.dlq import DeadLetter, dlq_headers
from flashcoupon_persister.rows import judge, to_row, utc_text
from flashcoupon_persister.settings import PersisterSettings

from tests.support.env import LOCAL

A = CouponIssued(
    event_id="ev",
    user_id="u1",
    seq=1,
    code="CODE1",
    tier="big",
    discount=Discount("fixed", amount=1000),
    issued_at_ms=1_780_000_000_123,
    expires_at_ms=1_790_000_000_000,
    request_id="r1",
)


def test_same_slot_same_code_is_stored() -> None:
    stored, rejected = judge([(0, A), (1, A)], {"CODE1": ("ev", "u1", 1)})
    assert (stored, rejected) == (2, [])


def test_same_code_other_slot_is_a_code_conflict() -> None:
    other = dataclasses.replace(A, user_id="u2")
    stored, rejected = judge([(3, other)], {"CODE1": ("ev", "u1", 1)})
    assert stored == 0
    assert [(r.index, r.reason, r.code) for r in rejected] == [(3, "conflict", "CODE_CONFLICT")]
    assert "user=u1" in rejected[0].detail


def test_same_slot_other_code_is_a_slot_conflict() -> None:
    other = dataclasses.replace(A, code="CODE2")
    stored, rejected = judge(
        [(0, A), (1, other)], {"CODE1": ("ev", "u1", 1)}, {("ev", "u1", 1): "CODE1"}
    )
    assert stored == 1
    assert [(r.index, r.code) for r in rejected] == [(1, "SLOT_CONFLICT")]
    assert "CODE1" in rejected[0].detail and "CODE2" in rejected[0].detail


def test_row_timestamps_are_naive_utc_with_milliseconds() -> None:
    row = to_row(A)
    assert row[9] == "2026-05-28 20:26:40.123"
    assert row[5:9] == ("fixed", 1000, None, None)
    assert utc_text(0) == "1970-01-01 00:00:00.000"
    assert utc_text(1_780_000_000_007) == "2026-05-28 20:26:40.007"
    for bad in (-1, 253_402_300_800_000):
        with pytest.raises(ValueError, match="outside"):
            utc_text(bad)


def _record(offset: int, value: bytes | None, headers: tuple = ()) -> ConsumerRecord:
    return ConsumerRecord(
        topic="t",
        partition=2,
        offset=offset,
        timestamp=1700,
        timestamp_type=0,
        key=b"u1",
        value=value,
        checksum=None,
        serialized_key_size=2,
        serialized_value_size=len(value or b""),
        headers=headers,
    )


def test_decode_all_separates_poison() -> None:
    wrong_version = A.encode().replace(b'"v":1', b'"v":99')
    records = [_record(0, A.encode()), _record(1, b"{nope"), _record(2, wrong_version)]
    records.append(_record(3, None))
    coupons, origins, dead = decode_all(records)
    assert coupons == [A] and [o.offset for o in origins] == [0]
    assert [(d.record.offset, d.reason, d.code) for d in dead] == [
        (1, "schema", "SCHEMA_ERROR"),
        (2, "schema", "SCHEMA_ERROR"),
        (3, "schema", "SCHEMA_ERROR"),
    ]


def test_dlq_headers_carry_reason_and_coordinates() -> None:
    rec = _record(41, b"x", headers=(("traceparent", b"00-abc"),))
    headers = dict(dlq_headers(DeadLetter(rec, "conflict", "CODE_CONFLICT", "why"), "grp"))
    assert headers["reason"] == b"conflict"
    assert headers["error-code"] == b"CODE_CONFLICT"
    assert headers["original-topic"] == b"t"
    assert headers["original-partition"] == b"2"
    assert headers["original-offset"] == b"41"
    assert headers["consumer-group"] == b"grp"
    assert headers["original-header-traceparent"] == b"00-abc"


def test_settings_from_env_and_validation() -> None:
    s = PersisterSettings.from_env(
        {**LOCAL, "FLASHCOUPON_PERSISTER_MAX_BATCH": "100", "FLASHCOUPON_PERSISTER_GROUP_ID": "g"}
    )
    assert (s.max_batch, s.group_id, s.topic, s.port) == (100, "g", "coupon-issued", 8083)
    with pytest.raises(SettingsError, match="FLASHCOUPON_PERSISTER_MAX_BATCH"):
        PersisterSettings.from_env({**LOCAL, "FLASHCOUPON_PERSISTER_MAX_BATCH": "0"})
    with pytest.raises(SettingsError, match="DB_POOL_SIZE"):
        PersisterSettings.from_env(
            {
                **LOCAL,
                "FLASHCOUPON_PERSISTER_WRITE_CONCURRENCY": "8",
                "FLASHCOUPON_PERSISTER_DB_POOL_SIZE": "4",
            }
        )
    with pytest.raises(SettingsError, match="DLQ_TOPIC"):
        PersisterSettings(
            KafkaSettings("k:1"), MysqlSettings("mysql+asyncmy://x"), dlq_topic="coupon-issued"
        )


@pytest.mark.parametrize(("value", "expected"), [("", 5.0), ("0.5", 0.5), ("30", 30.0)])
def test_db_write_timeout_setting(value: str, expected: float) -> None:
    env = {**LOCAL, "FLASHCOUPON_PERSISTER_DB_WRITE_TIMEOUT_S": value}
    assert PersisterSettings.from_env(env).db_write_timeout_s == expected


@pytest.mark.parametrize("value", ["0", "-1", "0.05", "601", "nan", "inf", "5s"])
def test_db_write_timeout_refuses_nonsense(value: str) -> None:
    with pytest.raises(SettingsError, match="FLASHCOUPON_PERSISTER_DB_WRITE_TIMEOUT_S"):
        PersisterSettings.from_env({**LOCAL, "FLASHCOUPON_PERSISTER_DB_WRITE_TIMEOUT_S": value})


def test_stalled_only_after_failing_longer_than_the_grace() -> None:
    assert not is_stalled(None, 1000.0)  # nothing failing
    assert not is_stalled(990.0, 990.2)  # one quick retry never flips readiness
    assert not is_stalled(990.0, 990.0 + STALL_GRACE_S)
    assert is_stalled(990.0, 990.0 + STALL_GRACE_S + 0.1)
    assert is_stalled(0.0, 3.0, grace_s=2.0)
