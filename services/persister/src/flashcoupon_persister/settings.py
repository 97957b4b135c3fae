"""Persister settings: FLASHCOUPON_PERSISTER_* plus the shared Kafka and MySQL pieces.

Read once at start-up; a malformed value fails start-up with a message naming the variable.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashcoupon_common import topics
from flashcoupon_common.settings import (
    FromEnv,
    KafkaSettings,
    MysqlSettings,
    SettingsError,
    between,
    non_negative,
    setting,
    tcp_port,
)

PREFIX = "FLASHCOUPON_PERSISTER_"


@dataclass(frozen=True)
class PersisterSettings(FromEnv):
    prefix = PREFIX

    kafka: KafkaSettings
    mysql: MysqlSettings
    group_id: str = "persister"
    topic: str = topics.COUPON_ISSUED
    dlq_topic: str = topics.COUPON_ISSUED_DLQ
    # One getmany() hands at most this many records to one DB transaction.
    max_batch: int = setting(4000, check=between(1, 50_000))
    # How long getmany() waits for records when fewer than max_batch are ready.
    max_wait_ms: int = setting(100, check=non_negative)
    # Batches written concurrently (each on its own connection); commits stay in order.
    write_concurrency: int = setting(4, check=between(1, 32))
    retry_backoff_base_s: float = 0.2
    retry_backoff_cap_s: float = 5.0
    # Longest wait for any one answer from the database (connect, pool checkout, INSERT of a
    # whole batch, SELECT, COMMIT). A healthy 4000-row INSERT takes 0.1-1 s even on a loaded
    # 2-core machine, so 5 s never cuts a healthy write, yet a hung server is noticed fast.
    db_write_timeout_s: float = setting(5.0, check=between(0.1, 600))  # also refuses NaN
    db_pool_size: int = 6  # write_concurrency + readiness checks
    host: str = "127.0.0.1"
    port: int = setting(8083, check=tcp_port)

    def __post_init__(self) -> None:
        if self.db_pool_size < self.write_concurrency:
            raise SettingsError(f"{PREFIX}DB_POOL_SIZE must be >= WRITE_CONCURRENCY")
        if not 0 < self.retry_backoff_base_s <= self.retry_backoff_cap_s:
            raise SettingsError(
                f"{PREFIX}RETRY_BACKOFF_BASE_S must be > 0 and <= RETRY_BACKOFF_CAP_S"
            )
        if self.topic == self.dlq_topic:
            raise SettingsError(f"{PREFIX}DLQ_TOPIC must differ from {PREFIX}TOPIC")
