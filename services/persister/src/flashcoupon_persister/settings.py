"""Persister settings: FLASHCOUPON_PERSISTER_* plus the shared Kafka and MySQL pieces.

Read once at start-up; a malformed value fails start-up with a message naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from flashcoupon_common import topics
from flashcoupon_common.settings import (
    KafkaSettings,
    MysqlSettings,
    SettingsError,
    env_float,
    env_int,
    env_str,
)

PREFIX = "FLASHCOUPON_PERSISTER_"


@dataclass(frozen=True)
class PersisterSettings:
    kafka: KafkaSettings
    mysql: MysqlSettings
    group_id: str = "persister"
    topic: str = topics.COUPON_ISSUED
    dlq_topic: str = topics.COUPON_ISSUED_DLQ
    # One getmany() hands at most this many records to one DB transaction.
    max_batch: int = 4000
    # How long getmany() waits for records when fewer than max_batch are ready.
    max_wait_ms: int = 100
    # Batches written concurrently (each on its own connection); commits stay in order.
    write_concurrency: int = 4
    retry_backoff_base_s: float = 0.2
    retry_backoff_cap_s: float = 5.0
    # Longest wait for any one answer from the database (connect, pool checkout, INSERT of a
    # whole batch, SELECT, COMMIT). A healthy 4000-row INSERT takes 0.1-1 s even on a loaded
    # 2-core machine, so 5 s never cuts a healthy write, yet a hung server is noticed fast.
    db_write_timeout_s: float = 5.0
    db_pool_size: int = 6  # write_concurrency + readiness checks
    host: str = "127.0.0.1"
    port: int = 8083

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PersisterSettings:
        env = os.environ if env is None else env
        p = PREFIX
        s = cls(
            kafka=KafkaSettings.from_env(env),
            mysql=MysqlSettings.from_env(env),
            group_id=env_str(env, p + "GROUP_ID", "persister"),
            topic=env_str(env, p + "TOPIC", topics.COUPON_ISSUED),
            dlq_topic=env_str(env, p + "DLQ_TOPIC", topics.COUPON_ISSUED_DLQ),
            max_batch=env_int(env, p + "MAX_BATCH", 4000),
            max_wait_ms=env_int(env, p + "MAX_WAIT_MS", 100),
            write_concurrency=env_int(env, p + "WRITE_CONCURRENCY", 4),
            retry_backoff_base_s=env_float(env, p + "RETRY_BACKOFF_BASE_S", 0.2),
            retry_backoff_cap_s=env_float(env, p + "RETRY_BACKOFF_CAP_S", 5.0),
            db_write_timeout_s=env_float(env, p + "DB_WRITE_TIMEOUT_S", 5.0),
            db_pool_size=env_int(env, p + "DB_POOL_SIZE", 6),
            host=env_str(env, p + "HOST", "127.0.0.1"),
            port=env_int(env, p + "PORT", 8083),
        )
        s.validate()
        return s

    def validate(self) -> None:
        if not 1 <= self.max_batch <= 50_000:
            raise SettingsError(f"{PREFIX}MAX_BATCH must be 1..50000, got {self.max_batch}")
        if not 1 <= self.write_concurrency <= 32:
            raise SettingsError(f"{PREFIX}WRITE_CONCURRENCY must be 1..32")
        if self.db_pool_size < self.write_concurrency:
            raise SettingsError(f"{PREFIX}DB_POOL_SIZE must be >= WRITE_CONCURRENCY")
        if self.max_wait_ms < 0:
            raise SettingsError(f"{PREFIX}MAX_WAIT_MS must be >= 0, got {self.max_wait_ms}")
        if not 0 < self.retry_backoff_base_s <= self.retry_backoff_cap_s:
            raise SettingsError(
                f"{PREFIX}RETRY_BACKOFF_BASE_S must be > 0 and <= RETRY_BACKOFF_CAP_S"
            )
        timeout = self.db_write_timeout_s
        if not 0.1 <= timeout <= 600:  # also refuses NaN
            raise SettingsError(f"{PREFIX}DB_WRITE_TIMEOUT_S must be 0.1..600 s, got {timeout}")
        if self.topic == self.dlq_topic:
            raise SettingsError(f"{PREFIX}DLQ_TOPIC must differ from {PREFIX}TOPIC")
        if not 1 <= self.port <= 65535:
            raise SettingsError(f"{PREFIX}PORT must be a TCP port, got {self.port}")
