"""The local stack is made of real servers: these tests fail against a stand-in."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from flashcoupon_common.db.schema import coupon_events
from redis.asyncio import Redis
from redis.crc import key_slot
from redis.exceptions import ClusterCrossSlotError, MovedError
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from tests.support.names import random_name


async def test_cross_slot_multikey_fails_but_hash_tagged_succeeds(redis_cluster) -> None:
    # Keys that hash to different slots, sent raw to one node (the cluster client would
    # otherwise split the command per slot): the server refuses them.
    a = random_name("a")
    b = next(
        k
        for k in (random_name("b") for _ in range(100))
        if key_slot(k.encode()) != key_slot(a.encode())
    )
    node = redis_cluster.get_node_from_key(a)
    async with Redis(host=node.host, port=node.port) as plain:
        with pytest.raises(ClusterCrossSlotError):  # the server said CROSSSLOT
            await plain.mset({a: 1, b: 2})
    tag = "{" + random_name("ev") + "}"
    assert await redis_cluster.execute_command("MSET", f"{tag}:a", "1", f"{tag}:b", "2")
    assert await redis_cluster.mget(f"{tag}:a", f"{tag}:b") == [b"1", b"2"]


async def test_lua_script_runs_on_the_slot_owner(redis_cluster) -> None:
    key = "{" + random_name("ev") + "}:counter"
    script = "redis.call('INCRBY', KEYS[1], ARGV[1]); return redis.call('GET', KEYS[1])"
    assert await redis_cluster.eval(script, 1, key, 5) == b"5"
    owner = redis_cluster.get_node_from_key(key)
    # The value lives on the node that owns the key's slot, and only there.
    assert await redis_cluster.execute_command("GET", key, target_nodes=owner) == b"5"
    # Through plain (non-cluster) connections: the owner has it, another master redirects.
    other = next(n for n in redis_cluster.get_primaries() if n.name != owner.name)
    async with Redis(host=owner.host, port=owner.port) as plain:
        assert await plain.get(key) == b"5"
    async with Redis(host=other.host, port=other.port) as plain:
        with pytest.raises(MovedError):
            await plain.get(key)


async def test_idempotent_producer_to_consumer_with_manual_commit(stack, kafka_topic) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=stack.kafka.bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        sent = [f"m{i}".encode() for i in range(20)]
        await asyncio.gather(*[await producer.send(kafka_topic, v, key=b"k") for v in sent])
    finally:
        await producer.stop()

    group = random_name("g")

    async def consume(n: int) -> list[bytes]:
        consumer = AIOKafkaConsumer(
            kafka_topic,
            bootstrap_servers=stack.kafka.bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        got: list[bytes] = []
        try:
            while len(got) < n:
                batch = await asyncio.wait_for(consumer.getmany(timeout_ms=500, max_records=n), 20)
                for records in batch.values():
                    got.extend(r.value for r in records)
            await consumer.commit()
        finally:
            await consumer.stop()
        return got

    first = await consume(10)
    assert first == sent[:10]  # one key → one partition → in order
    # A new consumer in the same group resumes after the committed offset.
    assert await consume(10) == sent[10:]


async def test_unique_violation_is_caught_as_integrity_error(mysql_engine) -> None:
    row = {
        "id": random_name("ev"),
        "title": "t",
        "quantity": 1,
        "per_user_limit": 1,
        "start_at": "2026-01-01 00:00:00",
        "end_at": "2026-01-02 00:00:00",
        "valid_for_seconds": 60,
        "spec": "{}",
    }
    async with mysql_engine.begin() as conn:
        await conn.execute(insert(coupon_events).values(row))
    with pytest.raises(IntegrityError) as info:
        async with mysql_engine.begin() as conn:
            await conn.execute(insert(coupon_events).values(row))
    assert info.value.orig.args[0] == 1062  # ER_DUP_ENTRY, not some other failure
    async with mysql_engine.connect() as conn:
        count = len((await conn.execute(select(coupon_events.c.id))).all())
    assert count == 1  # the failed transaction left nothing behind
