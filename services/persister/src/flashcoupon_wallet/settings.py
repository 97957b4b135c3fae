"""Wallet settings from the environment (prefix FLASHCOUPON_WALLET_), validated at start-up."""

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

PREFIX = "FLASHCOUPON_WALLET_"


@dataclass(frozen=True)
class WalletSettings:
    mysql: MysqlSettings
    kafka: KafkaSettings
    host: str = "127.0.0.1"
    port: int = 8082
    redeemed_topic: str = topics.COUPON_REDEEMED
    db_pool_size: int = 10
    max_body_bytes: int = 4096
    # coupon-redeemed events wait in the redeemed_outbox table, not in memory: a publisher
    # pass sends at most this many, and a pass runs after every redemption and at least
    # every poll interval (which is how entries a dead replica left behind are found).
    publish_batch: int = 500
    publish_poll_seconds: float = 1.0
    # On shutdown, the batch in flight gets this long to finish; what is left stays in the table.
    publish_drain_seconds: float = 5.0
    log_level: str = "INFO"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WalletSettings:
        env = os.environ if env is None else env
        settings = cls(
            mysql=MysqlSettings.from_env(env),
            kafka=KafkaSettings.from_env(env),
            host=env_str(env, PREFIX + "HOST", "127.0.0.1"),
            port=env_int(env, PREFIX + "PORT", 8082),
            redeemed_topic=env_str(env, PREFIX + "REDEEMED_TOPIC", topics.COUPON_REDEEMED),
            db_pool_size=env_int(env, PREFIX + "DB_POOL_SIZE", 10),
            max_body_bytes=env_int(env, PREFIX + "MAX_BODY_BYTES", 4096),
            publish_batch=env_int(env, PREFIX + "PUBLISH_BATCH", 500),
            publish_poll_seconds=env_float(env, PREFIX + "PUBLISH_POLL_SECONDS", 1.0),
            publish_drain_seconds=env_float(env, PREFIX + "PUBLISH_DRAIN_SECONDS", 5.0),
            log_level=env_str(env, PREFIX + "LOG_LEVEL", "INFO"),
        )
        for name, value in (
            ("PORT", settings.port),
            ("DB_POOL_SIZE", settings.db_pool_size),
            ("MAX_BODY_BYTES", settings.max_body_bytes),
            ("PUBLISH_BATCH", settings.publish_batch),
            ("PUBLISH_POLL_SECONDS", settings.publish_poll_seconds),
        ):
            if value <= 0:
                raise SettingsError(f"{PREFIX}{name} must be positive, got {value}")
        return settings
