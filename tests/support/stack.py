"""The local stack a test runs against, and the environment for a service process using it."""

from __future__ import annotations

import os
from dataclasses import dataclass

from flashcoupon_common.settings import KafkaSettings, MysqlSettings, RedisSettings


@dataclass(frozen=True)
class Stack:
    redis: RedisSettings
    kafka: KafkaSettings
    mysql: MysqlSettings

    def env(self) -> dict[str, str]:
        """Environment for a service process pointed at this stack."""
        return {
            **os.environ,
            "FLASHCOUPON_REDIS_NODES": ",".join(f"{h}:{p}" for h, p in self.redis.nodes),
            "FLASHCOUPON_KAFKA_BOOTSTRAP": self.kafka.bootstrap,
            "FLASHCOUPON_MYSQL_URL": self.mysql.url,
        }
