"""The relay's decisions: what is sent, what is acknowledged, when the producer is rebuilt."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest
from aiokafka import errors as kafka_errors
from aiokafka.partitioner import DefaultPartitioner
from flashcoupon_common.kafka_producer import needs_new_producer
from flashcoupon_common.messages import CouponIssued, Discount
from flashcoupon_common.settings import SettingsError
from flashcoupon_relay.policy import (
    MAX_RECORD_BYTES,
    Outgoing,
    by_partition,
    consumers_to_forget,
    entry_age_seconds,
    gather_pause,
    plan_batch,
    should_retire,
    split_results,
)
from flashcoupon_relay.settings import RelaySettings

from tests.support.env import LOCAL


def coupon(i: int, user: str = "u1") -> CouponIssued:
    return CouponIssued(
        event_id="ev1",
        user_id=user,
        seq=1,
        code=f"CODE{i}",
        tier="big",
        discount=Discount("percent", percent=5, max_amount=3000),
        issued_at_ms=1_700_000_000_000,
        expires_at_ms=1_700_000_600_000,
        request_id=f"req-{i}",
    )


def as_stream(fields: dict[str, str]) -> dict[bytes, bytes]:
    return {k.encode(): v.encode() for k, v in fields.items()}


def plan(entries):
    return plan_batch("{ev:ev1}:outbox", "ev1", entries, topic="t", dlq_topic="t-dlq")


def test_plan_sends_each_record_keyed_by_user_with_trace_headers() -> None:
    with_tp = coupon(1, "alice").to_outbox("00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    p = plan([(b"1-0", as_stream(with_tp)), (b"1-1", as_stream(coupon(2, "bob").to_outbox()))])
    assert [o.entry_id for o in p.outgoing] == ["1-0", "1-1"]
    first, second = p.outgoing
    assert (first.topic, first.key, first.dead_letter) == ("t", b"alice", False)
    assert CouponIssued.decode(first.value) == coupon(1, "alice")
    headers = dict(first.headers)
    assert headers["traceparent"].startswith(b"00-aaaa")
    assert headers["request-id"] == b"req-1"
    assert headers["event-id"] == b"ev1"
    assert headers["outbox-id"] == b"1-0"
    assert "traceparent" not in dict(second.headers)  # no traceparent, no header
    assert p.poison == [] and p.gone == []


def test_undecodable_entry_becomes_a_dead_letter_with_its_raw_fields() -> None:
    bad = {b"e": b"ev1", b"u": b"\xff\xfe", b"s": b"not-a-number"}
    p = plan([(b"2-0", bad), (b"2-1", as_stream(coupon(3).to_outbox()))])
    letter, good = p.outgoing
    assert letter.dead_letter and letter.topic == "t-dlq" and letter.entry_id == "2-0"
    body = orjson.loads(letter.value)
    assert body["id"] == "2-0" and body["eventId"] == "ev1"
    assert body["fields"]["s"] == "not-a-number"
    assert body["fields"]["u"] == "\\xff\\xfe"  # undecodable bytes kept visible, not dropped
    headers = dict(letter.headers)
    assert headers["reason"] == b"schema" and headers["error-code"] == b"OUTBOX_UNDECODABLE"
    assert headers["dead-lettered-by"] == b"relay" and headers["outbox-id"] == b"2-0"
    assert headers["error-detail"]
    assert [i for i, _ in p.poison] == ["2-0"]
    assert not good.dead_letter


def test_oversized_record_is_dead_lettered_truncated() -> None:
    huge = replace(coupon(4), user_id="x" * (MAX_RECORD_BYTES + 1)).to_outbox()
    p = plan([(b"3-0", as_stream(huge))])
    (letter,) = p.outgoing
    assert letter.dead_letter and len(letter.value) < 20_000
    assert dict(letter.headers)["error-code"] == b"RECORD_TOO_LARGE"


def test_deleted_pending_entries_are_only_acknowledged() -> None:
    # Redis returns a pending-but-deleted entry with no fields.
    p = plan([(b"4-0", {}), (b"4-1", as_stream(coupon(5).to_outbox()))])
    assert p.gone == ["4-0"]
    assert [o.entry_id for o in p.outgoing] == ["4-1"]


def _out(i: int, key: bytes = b"k", topic: str = "t") -> Outgoing:
    return Outgoing(str(i), topic, key, b"v", [])


def test_records_are_grouped_per_partition_as_the_default_partitioner_would() -> None:
    partitioner = DefaultPartitioner()
    batch = [_out(i, f"user-{i % 7}".encode()) for i in range(50)] + [_out(50, b"ev", "dlq")]
    groups = by_partition(batch, {"t": [0, 1, 2, 3, 4, 5], "dlq": [0]}, partitioner)
    assert sorted(i for idx in groups.values() for i in idx) == list(range(51))  # each once
    for (topic, partition), indices in groups.items():
        assert indices == sorted(indices)  # batch order kept: a user's records stay in order
        for i in indices:
            parts = [0] if topic == "dlq" else [0, 1, 2, 3, 4, 5]
            assert batch[i].topic == topic
            assert partitioner(batch[i].key, parts, parts) == partition
    # One user, one partition.
    assert len({p for (t, p), idx in groups.items() for i in idx if batch[i].key == b"user-3"}) == 1


def test_split_results_acks_only_what_kafka_acknowledged() -> None:
    sent = [_out(i) for i in range(4)]
    err = kafka_errors.KafkaConnectionError()
    done, again, first = split_results(sent, ["md", err, "md", TimeoutError()])
    assert [o.entry_id for o in done] == ["0", "2"]
    assert [o.entry_id for o in again] == ["1", "3"]
    assert first is err
    assert split_results(sent, ["md"] * 4) == (sent, [], None)
    with pytest.raises(ValueError):
        split_results(sent, ["md"])  # every record must have an outcome


@pytest.mark.parametrize(
    ("exc", "rebuild"),
    [
        (kafka_errors.OutOfOrderSequenceNumber(), True),
        (kafka_errors.ProducerFenced(), True),
        (kafka_errors.UnknownProducerId(), True),
        (kafka_errors.KafkaTimeoutError(), True),  # not retriable: the producer may be stuck
        (TimeoutError(), True),  # our own delivery timeout
        (RuntimeError("bug"), True),
        (kafka_errors.KafkaConnectionError(), False),  # retriable: same producer retries
        (kafka_errors.NotLeaderForPartitionError(), False),
        (kafka_errors.RequestTimedOutError(), False),
    ],
)
def test_which_errors_rebuild_the_producer(exc: BaseException, rebuild: bool) -> None:
    assert needs_new_producer(exc) is rebuild


def test_retire_only_when_unregistered_and_drained() -> None:
    assert should_retire(False, 0, 0)
    assert not should_retire(True, 0, 0)
    assert not should_retire(False, 3, 0)  # deleted event with undelivered entries
    assert not should_retire(False, 0, 2)


def test_forget_only_silent_consumers_holding_nothing() -> None:
    consumers = [
        {"name": b"me", "pending": 0, "idle": 10**9},
        {"name": b"dead-empty", "pending": 0, "idle": 7_200_000},
        {"name": b"dead-holding", "pending": 5, "idle": 7_200_000},
        {"name": b"alive", "pending": 0, "idle": 10},
    ]
    assert consumers_to_forget(consumers, me="me", idle_ms=3_600_000) == ["dead-empty"]


def test_entry_age_from_stream_id() -> None:
    assert entry_age_seconds(b"1700000000000-5", 1_700_000_002_500) == pytest.approx(2.5)
    assert entry_age_seconds("1700000000000-0", 1_699_999_999_000) == 0.0


def test_settings_from_env_and_validation() -> None:
    env = {
        **LOCAL,
        "FLASHCOUPON_RELAY_TOPIC": "x",
        "FLASHCOUPON_RELAY_BATCH_SIZE": "50",
        "FLASHCOUPON_RELAY_EVENTS": "a, b,",
        "FLASHCOUPON_RELAY_CONSUMER": "r1",
    }
    s = RelaySettings.from_env(env)
    assert (s.topic, s.batch_size, s.events, s.consumer, s.port) == (
        "x",
        50,
        ("a", "b"),
        "r1",
        8084,
    )
    assert RelaySettings.from_env(LOCAL).consumer  # hostname-pid by default
    with pytest.raises(SettingsError, match="FLASHCOUPON_RELAY_BATCH_SIZE"):
        RelaySettings.from_env({**LOCAL, "FLASHCOUPON_RELAY_BATCH_SIZE": "0"})
    with pytest.raises(SettingsError, match="BLOCK_MS"):
        RelaySettings.from_env({**LOCAL, "FLASHCOUPON_RELAY_BLOCK_MS": "6000"})
    with pytest.raises(SettingsError, match="CLAIM_IDLE_MS must be an integer"):
        RelaySettings.from_env({**LOCAL, "FLASHCOUPON_RELAY_CLAIM_IDLE_MS": "soon"})


def test_a_short_read_waits_for_entries_to_gather_and_a_full_or_empty_one_does_not() -> None:
    assert gather_pause(3, 1000, 50) == 0.05
    assert gather_pause(999, 1000, 50) == 0.05
    assert gather_pause(1000, 1000, 50) == 0.0  # a backlog: read again at once
    assert gather_pause(0, 1000, 50) == 0.0  # nothing read: the blocking read already waited
    assert gather_pause(3, 1000, 0) == 0.0  # turned off
