"""Issuer settings: FLASHCOUPON_ISSUER_* plus the shared Redis Cluster nodes.

Read once at start-up; a malformed value fails start-up with a message naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from flashcoupon_common.settings import (
    RedisSettings,
    SettingsError,
    env_choice,
    env_float,
    env_int,
    env_str,
)

PREFIX = "FLASHCOUPON_ISSUER_"


@dataclass(frozen=True)
class IssuerSettings:
    redis: RedisSettings
    host: str = "127.0.0.1"
    port: int = 8081
    # none: answer after the script ran on the master; replica: also WAIT for one replica
    # (docs/issuer.md says what each guarantees).
    durability: str = "none"
    wait_timeout_ms: int = 200
    # replica: what an unconfirmed write answers. "fail" = 503 NOT_DURABLE (fail closed: every
    # issue is refused while the master has no replica, e.g. after a failover until the old
    # master rejoins); "degrade" = answer the coupon as with `none`, counted in
    # flashcoupon_issuer_unconfirmed_total and logged (docs/issuer.md has the trade-off).
    unconfirmed: str = "fail"
    # How long a learned SOLD_OUT is answered locally before the script is asked again; a
    # supply change also clears it at once through pub/sub.
    sold_out_ttl_s: float = 2.0
    # Auto-pipelining; off only for the benchmark's naive one-EVALSHA-per-request variant.
    batching: bool = True
    max_batch: int = 512
    max_inflight: int = 2
    # How long one issue call may keep retrying through a failover before answering 503, when
    # the caller sent no deadline. The gateway sends X-Flashcoupon-Deadline-Ms (what it will
    # still wait); then the call ends DEADLINE_MARGIN_MS before that, so the 503 reaches the
    # gateway before it gives up (a gateway timeout would hide a coupon issued afterwards).
    retry_deadline_s: float = 15.0
    deadline_margin_ms: int = 300
    # Per node, for redis-py's own commands (the naive path and event reads); the batcher
    # uses max_inflight connections of its own per node.
    redis_max_connections: int = 512

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> IssuerSettings:
        env = os.environ if env is None else env
        p = PREFIX
        s = cls(
            redis=RedisSettings.from_env(env),
            host=env_str(env, p + "HOST", "127.0.0.1"),
            port=env_int(env, p + "PORT", 8081),
            durability=env_choice(env, p + "DURABILITY", ("none", "replica"), "none"),
            wait_timeout_ms=env_int(env, p + "WAIT_TIMEOUT_MS", 200),
            unconfirmed=env_choice(env, p + "UNCONFIRMED", ("fail", "degrade"), "fail"),
            sold_out_ttl_s=env_float(env, p + "SOLD_OUT_TTL_S", 2.0),
            batching=env_choice(env, p + "BATCHING", ("true", "false"), "true") == "true",
            max_batch=env_int(env, p + "MAX_BATCH", 512),
            max_inflight=env_int(env, p + "MAX_INFLIGHT", 2),
            retry_deadline_s=env_float(env, p + "RETRY_DEADLINE_S", 15.0),
            deadline_margin_ms=env_int(env, p + "DEADLINE_MARGIN_MS", 300),
            redis_max_connections=env_int(env, p + "REDIS_MAX_CONNECTIONS", 512),
        )
        s.validate()
        return s

    def validate(self) -> None:
        if not 0 < self.port < 65536:
            raise SettingsError(f"{PREFIX}PORT must be a TCP port, got {self.port}")
        if self.wait_timeout_ms <= 0:
            raise SettingsError(f"{PREFIX}WAIT_TIMEOUT_MS must be > 0")
        if self.sold_out_ttl_s < 0:
            raise SettingsError(f"{PREFIX}SOLD_OUT_TTL_S must be >= 0")
        if self.retry_deadline_s <= 0 or self.deadline_margin_ms < 0:
            raise SettingsError(f"{PREFIX}RETRY_DEADLINE_S must be > 0, DEADLINE_MARGIN_MS >= 0")
        if self.max_batch < 1 or self.max_inflight < 1:
            raise SettingsError(f"{PREFIX}MAX_BATCH and {PREFIX}MAX_INFLIGHT must be >= 1")
