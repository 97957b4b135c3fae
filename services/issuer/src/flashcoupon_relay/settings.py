"""Settings of the outbox relay process, from FLASHCOUPON_RELAY_* (plus the shared Redis/Kafka).

The relay's timing knobs interact: `claim_idle_ms` must be well above the time a healthy relay
holds a batch (read → Kafka ack → XACK), or live relays steal each other's batches and
duplicate records; `block_ms` must stay below the Redis client's socket timeout (5 s).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from flashcoupon_common import topics
from flashcoupon_common.settings import (
    KafkaSettings,
    RedisSettings,
    SettingsError,
    env_choice,
    env_int,
    env_str,
)

PREFIX = "FLASHCOUPON_RELAY_"


def default_consumer_name() -> str:
    """hostname-pid: unique per process; a pod restarted in place (same hostname, pid 1)
    gets its old name back and re-delivers its own pending entries first."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class RelaySettings:
    redis: RedisSettings
    kafka: KafkaSettings
    consumer: str
    topic: str = topics.COUPON_ISSUED
    dlq_topic: str = topics.COUPON_ISSUED_DLQ
    batch_size: int = 1000
    block_ms: int = 1000
    linger_ms: int = 5
    claim_idle_ms: int = 30_000
    claim_interval_ms: int = 5_000
    registry_refresh_ms: int = 3_000
    metrics_interval_ms: int = 5_000
    delivery_timeout_ms: int = 15_000
    backoff_base_ms: int = 100
    backoff_max_ms: int = 5_000
    shutdown_grace_ms: int = 10_000
    # Consumers with nothing pending and idle this long are removed from the group (dead pods).
    forget_consumer_ms: int = 3_600_000
    # Only these event ids (empty: every event in the registry). For a relay dedicated to a hot
    # event, and for tests on a shared Redis, which must not take other tests' entries.
    events: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8084
    # "replica": publish an outbox batch only once a replica holds it (WAIT 1), as the issuer's
    # durability "replica" answers a coupon only then — see stream.OutboxStream._confirmed.
    durability: str = "none"
    wait_timeout_ms: int = 200

    def __post_init__(self) -> None:
        positive = (
            "batch_size",
            "block_ms",
            "claim_idle_ms",
            "claim_interval_ms",
            "registry_refresh_ms",
            "metrics_interval_ms",
            "delivery_timeout_ms",
            "backoff_base_ms",
            "backoff_max_ms",
            "shutdown_grace_ms",
            "forget_consumer_ms",
            "wait_timeout_ms",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise SettingsError(f"{PREFIX}{name.upper()} must be > 0")
        if self.linger_ms < 0:
            raise SettingsError(f"{PREFIX}LINGER_MS must be >= 0")
        if self.block_ms >= 5_000:
            raise SettingsError(f"{PREFIX}BLOCK_MS must be below the 5000 ms Redis socket timeout")
        if self.backoff_max_ms < self.backoff_base_ms:
            raise SettingsError(f"{PREFIX}BACKOFF_MAX_MS must be >= {PREFIX}BACKOFF_BASE_MS")
        if self.topic == self.dlq_topic:
            raise SettingsError(f"{PREFIX}TOPIC and {PREFIX}DLQ_TOPIC must differ")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RelaySettings:
        env = os.environ if env is None else env
        d = cls.__dataclass_fields__

        def num(name: str) -> int:
            return env_int(env, PREFIX + name.upper(), d[name].default)  # type: ignore[arg-type]

        return cls(
            redis=RedisSettings.from_env(env),
            kafka=KafkaSettings.from_env(env),
            consumer=env_str(env, PREFIX + "CONSUMER", default_consumer_name()),
            topic=env_str(env, PREFIX + "TOPIC", topics.COUPON_ISSUED),
            dlq_topic=env_str(env, PREFIX + "DLQ_TOPIC", topics.COUPON_ISSUED_DLQ),
            batch_size=num("batch_size"),
            block_ms=num("block_ms"),
            linger_ms=num("linger_ms"),
            claim_idle_ms=num("claim_idle_ms"),
            claim_interval_ms=num("claim_interval_ms"),
            registry_refresh_ms=num("registry_refresh_ms"),
            metrics_interval_ms=num("metrics_interval_ms"),
            delivery_timeout_ms=num("delivery_timeout_ms"),
            backoff_base_ms=num("backoff_base_ms"),
            backoff_max_ms=num("backoff_max_ms"),
            shutdown_grace_ms=num("shutdown_grace_ms"),
            forget_consumer_ms=num("forget_consumer_ms"),
            events=tuple(e.strip() for e in env.get(PREFIX + "EVENTS", "").split(",") if e.strip()),
            host=env_str(env, PREFIX + "HOST", "127.0.0.1"),
            port=num("port"),
            durability=env_choice(env, PREFIX + "DURABILITY", ("none", "replica"), "none"),
            wait_timeout_ms=num("wait_timeout_ms"),
        )
