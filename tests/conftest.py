"""Fixtures shared by every test tier.

Tests under tests/integration, tests/e2e and tests/bench use the real local stack. The
`stack` fixture uses a running one, or starts it with scripts/stack.sh when it is absent, so
`pytest` works on a fresh machine too. Each test gets its own names (event ids, topics,
databases) from `random_name`, so tests share servers without seeing each other's data.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import KafkaSettings, MysqlSettings, RedisSettings
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

ROOT = Path(__file__).resolve().parent.parent
# Tests run against the local stack: connection settings may default to it (the Makefile sets
# this too; here it is for `pytest` run by hand). Service processes the tests start inherit it.
os.environ.setdefault("FLASHCOUPON_ENV", "local")
TIERS = ("unit", "integration", "e2e", "bench")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        if parts and parts[0] in TIERS:
            item.add_marker(getattr(pytest.mark, parts[0] if parts[0] != "bench" else "slow"))


def random_name(prefix: str) -> str:
    """A name no other test uses: lowercase, Kubernetes- and MySQL-safe."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


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


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def stack() -> Stack:
    s = Stack(RedisSettings.from_env(), KafkaSettings.from_env(), MysqlSettings.from_env())
    host, port = s.kafka.bootstrap.split(",")[0].rsplit(":", 1)
    mysql = make_url(s.mysql.url)
    endpoints = [*s.redis.nodes, (host, int(port)), (mysql.host or "127.0.0.1", mysql.port or 3306)]
    if not all(_reachable(h, p) for h, p in endpoints):
        subprocess.run([str(ROOT / "scripts" / "stack.sh"), "up"], check=True)
    return s


@pytest.fixture(scope="session")
async def redis_cluster(stack: Stack) -> AsyncIterator[object]:
    client = create_redis_cluster(stack.redis)
    await client.initialize()
    yield client
    await client.aclose()


@pytest.fixture
async def kafka_topic(stack: Stack) -> AsyncIterator[str]:
    """A fresh topic with 3 partitions, deleted afterwards."""
    from flashcoupon_common.kafka_admin import create_topics, delete_topics

    name = random_name("t")
    await create_topics(stack.kafka.bootstrap, name)
    yield name
    await delete_topics(stack.kafka.bootstrap, name)


@pytest.fixture
async def mysql_url(stack: Stack) -> AsyncIterator[str]:
    """A fresh database with the schema migrated to head; dropped afterwards."""
    from flashcoupon_common.db.migrate import upgrade

    base = make_url(stack.mysql.url)
    db = random_name("t").replace("-", "_")
    url = base.set(database=db).render_as_string(hide_password=False)
    admin = create_async_engine(base)
    try:
        async with admin.begin() as conn:
            await conn.execute(
                text(f"CREATE DATABASE `{db}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
            )
        # Alembic's env.py runs its own event loop, so it gets a thread of its own.
        await asyncio.to_thread(upgrade, url)
        yield url
        async with admin.begin() as conn:
            await conn.execute(text(f"DROP DATABASE IF EXISTS `{db}`"))
    finally:
        await admin.dispose()


@pytest.fixture
async def mysql_engine(mysql_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(mysql_url)
    yield engine
    await engine.dispose()
