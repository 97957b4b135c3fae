"""Settings of the outbox relay process, from FLASHCOUPON_RELAY_* (plus the shared Redis/Kafka).

The relay's timing knobs interact: `claim_idle_ms` must be well above the time a healthy relay
holds a batch (read → Kafka ack → XACK), or live relays steal each other's batches and
duplicate records; `block_ms` must stay below the Redis client's socket timeout (5 s).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from flashcoupon_common import topics
from flashcoupon_common.settings import (
    FromEnv,
    KafkaSettings,
    RedisSettings,
    SettingsError,
    non_negative,
    positive,
    setting,
)

PREFIX = "FLASHCOUPON_RELAY_"


def default_consumer_name() -> str:
    """hostname-pid: unique per process; a pod restarted in place (same hostname, pid 1)
    gets its old name back and re-delivers its own pending entries first."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class RelaySettings(FromEnv):
    prefix = PREFIX

    redis: RedisSettings
    kafka: KafkaSettings
    consumer: str = setting(default_factory=default_consumer_name)
    topic: str = topics.COUPON_ISSUED
    dlq_topic: str = topics.COUPON_ISSUED_DLQ
    batch_size: int = setting(1000, check=positive)
    block_ms: int = setting(1000, check=positive)
    linger_ms: int = setting(5, check=non_negative)
    # After a short read, wait this long before reading again (policy.gather_pause): entries
    # reach Kafka up to this much later, in a few large batches instead of many small ones.
    gather_ms: int = setting(50, check=non_negative)
    claim_idle_ms: int = setting(30_000, check=positive)
    claim_interval_ms: int = setting(5_000, check=positive)
    registry_refresh_ms: int = setting(3_000, check=positive)
    metrics_interval_ms: int = setting(5_000, check=positive)
    delivery_timeout_ms: int = setting(15_000, check=positive)
    backoff_base_ms: int = setting(100, check=positive)
    backoff_max_ms: int = setting(5_000, check=positive)
    shutdown_grace_ms: int = setting(10_000, check=positive)
    # Consumers with nothing pending and idle this long are removed from the group (dead pods).
    forget_consumer_ms: int = setting(3_600_000, check=positive)
    # Only these event ids (empty: every event in the registry). For a relay dedicated to a hot
    # event, and for tests on a shared Redis, which must not take other tests' entries.
    events: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8084
    log_level: str = "INFO"
    # "replica": publish an outbox batch only once a replica holds it (WAIT 1), as the issuer's
    # durability "replica" answers a coupon only then — see stream.OutboxStream._confirmed.
    durability: str = setting("none", choices=("none", "replica"))
    wait_timeout_ms: int = setting(200, check=positive)

    def __post_init__(self) -> None:
        if self.block_ms >= 5_000:
            raise SettingsError(f"{PREFIX}BLOCK_MS must be below the 5000 ms Redis socket timeout")
        if self.backoff_max_ms < self.backoff_base_ms:
            raise SettingsError(f"{PREFIX}BACKOFF_MAX_MS must be >= {PREFIX}BACKOFF_BASE_MS")
        if self.topic == self.dlq_topic:
            raise SettingsError(f"{PREFIX}TOPIC and {PREFIX}DLQ_TOPIC must differ")
