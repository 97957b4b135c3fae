"""The wallet publisher's decisions: what was acknowledged, when to rebuild the producer, how
long to wait; and the message a redemption commits to the outbox (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from aiokafka import errors as kafka_errors
from flashcoupon_common.messages import CouponRedeemed
from flashcoupon_common.settings import SettingsError
from flashcoupon_wallet.outbox import OutboxEntry
from flashcoupon_wallet.publisher import needs_new_producer, next_wait, split_acked
from flashcoupon_wallet.redemption import Redemption, redeemed_event
from flashcoupon_wallet.settings import WalletSettings
from sqlalchemy.exc import OperationalError

from tests.support.env import LOCAL


def entry(i: int) -> OutboxEntry:
    return OutboxEntry(id=i, key=b"alice", payload=b"{}")


def test_split_acked_keeps_acknowledged_ids_and_the_first_error() -> None:
    first, second = kafka_errors.KafkaTimeoutError(), kafka_errors.NotLeaderForPartitionError()
    results: list[object] = ["meta", first, "meta", second]
    assert split_acked([entry(i) for i in (7, 8, 9, 10)], results) == ([7, 9], first)
    assert split_acked([entry(1), entry(2)], ["meta", "meta"]) == ([1, 2], None)
    with pytest.raises(ValueError):  # a result per entry, or it is a bug
        split_acked([entry(1)], [])


def test_only_kafka_trouble_rebuilds_the_producer() -> None:
    assert needs_new_producer(kafka_errors.OutOfOrderSequenceNumber())
    assert needs_new_producer(TimeoutError())  # a send that never answered: maybe wedged
    assert needs_new_producer(RuntimeError("bug"))
    assert not needs_new_producer(kafka_errors.KafkaConnectionError())  # retriable
    assert not needs_new_producer(kafka_errors.NotLeaderForPartitionError())
    assert not needs_new_producer(OperationalError("SELECT 1", {}, Exception("gone")))


def test_next_wait_backs_off_after_failures_runs_on_after_a_full_batch_else_polls() -> None:
    def wait(claimed: int, failures: int) -> float:
        return next_wait(
            claimed, 500, failures, poll=1.0, retry_initial=0.2, retry_max=5.0, rand=lambda: 1.0
        )

    assert [wait(0, n) for n in (1, 2, 3, 4, 5, 6, 100)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert wait(500, 0) == 0.0  # a full batch: more is probably waiting
    assert wait(499, 0) == 1.0
    assert wait(0, 0) == 1.0
    assert wait(500, 1) == 0.2  # a failure backs off even after a full batch


def test_redeemed_event_carries_the_redemption_in_milliseconds() -> None:
    r = Redemption(
        event_id="bf",
        user_id="alice",
        code="K7Q",
        order_id="o-1",
        order_amount=50_000,
        discount_amount=10_000,
        redeemed_at=datetime(2026, 11, 27, 5, 0, 0, 123_000, tzinfo=UTC),
    )
    e = redeemed_event(r)
    assert e == CouponRedeemed("bf", "alice", "K7Q", "o-1", 50_000, 10_000, 1_795_755_600_123)
    assert CouponRedeemed.decode(e.encode()) == e and e.kafka_key() == b"alice"


def test_publish_settings_are_validated_and_named() -> None:
    s = WalletSettings.from_env({**LOCAL, "FLASHCOUPON_WALLET_PUBLISH_POLL_SECONDS": "0.5"})
    assert (s.publish_batch, s.publish_poll_seconds) == (500, 0.5)
    with pytest.raises(SettingsError, match="FLASHCOUPON_WALLET_PUBLISH_BATCH"):
        WalletSettings.from_env({**LOCAL, "FLASHCOUPON_WALLET_PUBLISH_BATCH": "0"})
    with pytest.raises(SettingsError, match="FLASHCOUPON_WALLET_PUBLISH_POLL_SECONDS"):
        WalletSettings.from_env({**LOCAL, "FLASHCOUPON_WALLET_PUBLISH_POLL_SECONDS": "0"})
