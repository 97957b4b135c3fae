"""The relay across a Redis master failover: it keeps going, and nothing that was in the outbox
(and on a replica) before the crash is lost on the way to Kafka.

A private Redis Cluster (tests/private_stack.py) whose master owning the event's slot is
SIGKILLed while the relay works through the outbox. Its consumer-group state (pending list,
XACK/XDEL) replicates asynchronously, so the promoted replica may hand out entries again:
duplicates in Kafka are expected and counted, losses are not allowed.
"""

from __future__ import annotations

import asyncio
import shutil

from flashcoupon_common import keys
from flashcoupon_common.kafka_admin import create_topics
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import RedisSettings
from flashcoupon_relay.relay import Relay
from redis.asyncio import Redis
from redis.exceptions import RedisError

from tests.conftest import random_name
from tests.integration.test_relay_pipeline import (
    codes_of,
    make_coupons,
    metric,
    outbox_drained,
    read_all,
    register,
    relay_settings,
    running,
    wait_until,
    write_outbox,
)
from tests.private_stack import private_redis
from tests.support.env import LOCAL


async def replicated(host: str, port: int) -> None:
    """Wait until every replica of this master has acknowledged all its writes so far."""
    async with Redis(host=host, port=port) as master:
        role = await master.execute_command("ROLE")
        target = int(role[1])
        for _ in range(100):
            role = await master.execute_command("ROLE")
            if role[2] and all(int(r[2]) >= target for r in role[2]):
                return
            await asyncio.sleep(0.05)
    raise AssertionError("replica did not catch up")


async def write_with_retries(redis, coupons: list) -> None:
    """Through a failover writes fail for a few seconds; retry each chunk until it lands
    (a chunk applied twice only means a duplicate record, which is allowed)."""
    for i in range(0, len(coupons), 50):
        for _ in range(100):
            try:
                await write_outbox(redis, coupons[i : i + 50])
                break
            except (RedisError, OSError):
                await asyncio.sleep(0.2)
        else:
            raise AssertionError("writes did not resume after the failover")


async def test_relay_survives_a_master_failover_without_loss(stack) -> None:
    server, ports = private_redis()
    await asyncio.to_thread(server.start)
    nodes = ",".join(f"127.0.0.1:{p}" for p in ports)
    redis = create_redis_cluster(
        RedisSettings.from_env({**LOCAL, "FLASHCOUPON_REDIS_NODES": nodes})
    )
    event_id, topic = random_name("rel"), random_name("t-relay")
    try:
        await redis.initialize()
        await create_topics(stack.kafka.bootstrap, topic, topic + "-dlq")
        await register(redis, event_id)
        key = keys.outbox_key(event_id)
        coupons = make_coupons(event_id, 3000, users=1000)
        await write_outbox(redis, coupons[:1500])
        master = redis.get_node_from_key(key)
        env = {**stack.env(), "FLASHCOUPON_REDIS_NODES": nodes}
        # Small batches and a long linger: the relay is mid-stream when the master dies.
        settings = relay_settings(env, event_id, topic, batch_size=50, linger_ms=100)
        relay_redis = create_redis_cluster(settings.redis)
        relay = Relay(settings, relay_redis)
        async with running(relay):
            await wait_until(lambda: _below(redis, key, 1400), within=30, what="relaying under way")
            await replicated(master.host, master.port)
            await asyncio.to_thread(server.kill, master.port)
            await write_with_retries(redis, coupons[1500:])  # lands on the promoted replica
            await asyncio.to_thread(server.start)  # the old master returns as a replica
            await wait_until(lambda: outbox_drained(redis, event_id), within=90, what="drain")
            relayed = metric(relay, "flashcoupon_relay_relayed_total", event=event_id)
        await relay_redis.aclose()

        codes = codes_of(await read_all(stack.kafka.bootstrap, topic))
        assert set(codes) == {c.code for c in coupons}  # none lost
        print(
            f"failover: {len(coupons)} coupons, {len(codes)} records "
            f"({len(codes) - len(set(codes))} duplicates), relayed counter {relayed:.0f}"
        )
    finally:
        await redis.aclose()
        await asyncio.to_thread(server.stop)
        shutil.rmtree(server.env["FLASHCOUPON_STACK_DIR"], ignore_errors=True)


async def _below(redis, key: str, length: int) -> bool:
    return await redis.xlen(key) < length
