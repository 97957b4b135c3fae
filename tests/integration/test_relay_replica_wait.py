"""The relay with durability "replica": an outbox entry reaches Kafka only once a replica
holds it (flashcoupon_relay.stream.OutboxStream._confirmed).

Without it, a failover could discard an entry the relay had already published: a coupon in
MySQL that the promoted master never issued, whose holder — answered 503 NOT_DURABLE — is told
SOLD_OUT on retry (chaos rows redis-master-kill-replica / -freeze-replica). A private Redis
Cluster; the replica of the event's master is frozen (SIGSTOP: it stops acknowledging) while
entries are written, then resumed.
"""

from __future__ import annotations

import asyncio
import logging
import shutil

import pytest
from flashcoupon_common import keys
from flashcoupon_common.kafka_admin import create_topics
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import RedisSettings
from flashcoupon_relay.relay import Relay
from redis.asyncio import Redis

from tests.support.env import LOCAL
from tests.support.names import random_name
from tests.support.polling import wait_until
from tests.support.private_stack import private_redis
from tests.support.relay import (
    codes_of,
    make_coupons,
    outbox_drained,
    read_all,
    register,
    relay_settings,
    running,
    write_outbox,
)


async def replica_port(host: str, port: int) -> int:
    async with Redis(host=host, port=port) as master:
        for _ in range(200):
            role = await master.execute_command("ROLE")
            if role[2]:
                return int(role[2][0][1])
            await asyncio.sleep(0.05)
    raise AssertionError(f"master {port} has no replica")


async def test_replica_durability_publishes_only_what_a_replica_holds(
    stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="flashcoupon_relay")
    server, ports = private_redis()
    await asyncio.to_thread(server.start)
    nodes = ",".join(f"127.0.0.1:{p}" for p in ports)
    redis = create_redis_cluster(
        RedisSettings.from_env({**LOCAL, "FLASHCOUPON_REDIS_NODES": nodes})
    )
    event_id, topic = random_name("relw"), random_name("t-relw")
    frozen: int | None = None
    try:
        await redis.initialize()
        await create_topics(stack.kafka.bootstrap, topic, topic + "-dlq")
        await register(redis, event_id)
        key = keys.outbox_key(event_id)
        master = redis.get_node_from_key(key)
        frozen = await replica_port(master.host, master.port)
        await asyncio.to_thread(server.freeze, frozen)
        coupons = make_coupons(event_id, 200, users=200)
        await write_outbox(redis, coupons)
        env = {**stack.env(), "FLASHCOUPON_REDIS_NODES": nodes}
        settings = relay_settings(
            env, event_id, topic, durability="replica", wait_timeout_ms=100, backoff_max_ms=300
        )
        relay_redis = create_redis_cluster(settings.redis)
        relay = Relay(settings, relay_redis)
        async with running(relay):

            def refused() -> bool:
                return caplog.text.count("NotConfirmed") >= 3

            await wait_until(refused, within=60, what="the relay refused unconfirmed batches")
            # Tried three times and refused: nothing may have reached Kafka meanwhile.
            assert codes_of(await read_all(stack.kafka.bootstrap, topic)) == []
            assert await redis.xlen(key) == len(coupons)
            await asyncio.to_thread(server.thaw, frozen)
            frozen = None
            await wait_until(lambda: outbox_drained(redis, event_id), within=90, what="drain")
        await relay_redis.aclose()
        codes = codes_of(await read_all(stack.kafka.bootstrap, topic))
        assert set(codes) == {c.code for c in coupons}
    finally:
        if frozen is not None:
            await asyncio.to_thread(server.thaw, frozen)
        await redis.aclose()
        await asyncio.to_thread(server.stop)
        shutil.rmtree(server.env["FLASHCOUPON_STACK_DIR"], ignore_errors=True)
