"""Outbox entries and the topic they become: what the relay benchmark and the relay tests share.

Entries are written exactly as the issuer's script writes them (CouponIssued.to_outbox fields
XADDed to keys.outbox_key, the id SADDed to keys.EVENTS_REGISTRY), in pipelined chunks so a
50,000-entry backlog takes seconds. `read_all` reads a topic completely: an outbox entry is
deleted only after Kafka acknowledged its record, so once the outbox is drained every record
is below the end offsets read at call time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from flashcoupon_common import keys
from flashcoupon_common.messages import CouponIssued, Discount
from flashcoupon_relay.relay import Relay
from flashcoupon_relay.settings import RelaySettings


def make_coupons(event_id: str, n: int, *, users: int | None = None) -> list[CouponIssued]:
    """n coupons; with `users`, several per user (seq 1, 2, ...) so per-key order matters."""
    users = users or n
    out = []
    for i in range(n):
        out.append(
            CouponIssued(
                event_id=event_id,
                user_id=f"user-{i % users}",
                seq=i // users + 1,
                code=f"{event_id}-C{i:06d}",
                tier="big" if i % 10 == 0 else "small",
                discount=Discount("fixed", amount=10_000)
                if i % 10 == 0
                else Discount("percent", percent=5, max_amount=3000),
                issued_at_ms=1_795_000_000_000 + i,
                expires_at_ms=1_797_592_000_000 + i,
                request_id=f"req-{i}",
            )
        )
    return out


async def register(redis: Any, event_id: str) -> None:
    await redis.sadd(keys.EVENTS_REGISTRY, event_id)


async def write_outbox(redis: Any, coupons: Iterable[CouponIssued], *, chunk: int = 500) -> None:
    """XADD the entries in pipelined chunks (what the issuer's script does one at a time)."""
    coupons = list(coupons)
    for start in range(0, len(coupons), chunk):
        async with redis.pipeline() as pipe:
            for c in coupons[start : start + chunk]:
                fields = c.to_outbox(f"00-{c.code.encode().hex()[-32:]:0>32}-{'1' * 16}-01")
                pipe.xadd(keys.outbox_key(c.event_id), fields)
            await pipe.execute()


async def cleanup_event(redis: Any, event_id: str) -> None:
    await redis.srem(keys.EVENTS_REGISTRY, event_id)
    await redis.delete(keys.outbox_key(event_id))


async def read_all(bootstrap: str, topic: str, *, within: float = 60) -> list[Any]:
    """Every record of the topic, from the beginning up to its end offsets at call time.

    An outbox entry is deleted only after Kafka acknowledged its record, so once the outbox
    is drained every record is below the end offsets: this read is complete, not a sample.
    """
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    records: list[Any] = []
    try:
        parts = await consumer._client._wait_on_metadata(topic)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + within
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            assert time.monotonic() < deadline, f"reading {topic} timed out"
            batch = await consumer.getmany(timeout_ms=500, max_records=5000)
            for part in batch.values():
                records.extend(part)
    finally:
        await consumer.stop()
    return records


def codes_of(records: list[Any]) -> list[str]:
    return [CouponIssued.decode(r.value).code for r in records]


async def outbox_drained(redis: Any, event_id: str) -> bool:
    key = keys.outbox_key(event_id)
    if await redis.xlen(key):
        return False
    pending: int = (await redis.xpending(key, keys.RELAY_GROUP))["pending"]
    return pending == 0


async def wait_drained(redis: Any, event_id: str, *, within: float, interval: float = 0.05) -> None:
    """Poll until the event's outbox is drained; TimeoutError after `within` seconds."""
    deadline = time.monotonic() + within
    while not await outbox_drained(redis, event_id):
        if time.monotonic() > deadline:
            raise TimeoutError(f"outbox of {event_id} not drained after {within}s")
        await asyncio.sleep(interval)


def relay_settings(
    bootstrap_env: Mapping[str, str], event_id: str, topic: str, **kw: Any
) -> RelaySettings:
    """Settings for a relay restricted to one event and topic, with short intervals."""
    base = RelaySettings.from_env(bootstrap_env)
    options = {
        "consumer": f"relay-{uuid.uuid4().hex[:10]}",
        "topic": topic,
        "dlq_topic": topic + "-dlq",
        "events": (event_id,),
        "block_ms": 200,
        "registry_refresh_ms": 200,
        "claim_interval_ms": 300,
        "metrics_interval_ms": 300,
        "backoff_max_ms": 1000,
        **kw,
    }
    return dataclasses.replace(base, **options)


@contextlib.asynccontextmanager
async def running(relay: Relay) -> AsyncIterator[Relay]:
    """The relay running as a task of this loop; stopped (and awaited) on exit."""
    task = asyncio.create_task(relay.run())
    try:
        yield relay
    finally:
        relay.stop()
        await asyncio.wait_for(task, 30)
