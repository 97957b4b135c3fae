"""Wallet settings from the environment (prefix FLASHCOUPON_WALLET_), validated at start-up."""

from __future__ import annotations

from dataclasses import dataclass

from flashcoupon_common import topics
from flashcoupon_common.settings import FromEnv, KafkaSettings, MysqlSettings, positive, setting

PREFIX = "FLASHCOUPON_WALLET_"


@dataclass(frozen=True)
class WalletSettings(FromEnv):
    prefix = PREFIX

    mysql: MysqlSettings
    kafka: KafkaSettings
    host: str = "127.0.0.1"
    port: int = setting(8082, check=positive)
    redeemed_topic: str = topics.COUPON_REDEEMED
    db_pool_size: int = setting(10, check=positive)
    max_body_bytes: int = setting(4096, check=positive)
    # coupon-redeemed events wait in the redeemed_outbox table, not in memory: a publisher
    # pass sends at most this many, and a pass runs after every redemption and at least
    # every poll interval (which is how entries a dead replica left behind are found).
    publish_batch: int = setting(500, check=positive)
    publish_poll_seconds: float = setting(1.0, check=positive)
    # On shutdown, the batch in flight gets this long to finish; what is left stays in the table.
    publish_drain_seconds: float = 5.0
    log_level: str = "INFO"
