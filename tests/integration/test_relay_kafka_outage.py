"""Kafka stopped in the middle of a burst: the outbox absorbs it, nothing is lost.

Uses a private broker (tests/private_stack.py) that this test stops and starts; the shared
stack is never touched. Entries keep being written while the broker is down (the issuer's
script does not need Kafka), the relay retries without acknowledging, and after the broker is
back every record reaches the topic at least once. Duplicates are allowed and reported.
"""

from __future__ import annotations

import asyncio
import shutil

from flashcoupon_common import keys
from flashcoupon_issuer.relay import Relay

from tests.conftest import random_name
from tests.integration.test_relay_pipeline import (
    cleanup_event,
    codes_of,
    create_topics,
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
from tests.private_stack import private_kafka


async def test_kafka_stopped_during_a_burst_loses_nothing(stack, redis_cluster) -> None:
    broker, bootstrap = private_kafka()
    await asyncio.to_thread(broker.start)
    event_id, topic = random_name("rel"), random_name("t-relay")
    try:
        await create_topics(bootstrap, topic, topic + "-dlq")
        await register(redis_cluster, event_id)
        env = {**stack.env(), "FLASHCOUPON_KAFKA_BOOTSTRAP": bootstrap}
        settings = relay_settings(
            env, event_id, topic, batch_size=200, delivery_timeout_ms=4000, backoff_max_ms=1000
        )
        relay = Relay(settings, redis_cluster)
        coupons = make_coupons(event_id, 3000, users=1000)
        key = keys.outbox_key(event_id)
        async with running(relay):
            # A steady stream of issued coupons before, during and after the outage.
            async def burst(part: list, pause: float) -> None:
                for i in range(0, len(part), 50):
                    await write_outbox(redis_cluster, part[i : i + 50])
                    await asyncio.sleep(pause)

            await burst(coupons[:600], 0.05)
            await wait_until(
                lambda: _relayed_some(redis_cluster, key, 600), within=30, what="first records"
            )
            writing = asyncio.create_task(burst(coupons[600:], 0.4))  # ~20 s of writes
            await asyncio.to_thread(broker.stop)
            # Broker down: entries keep arriving and stay in the outbox (it is the buffer).
            before = await redis_cluster.xlen(key)
            await asyncio.sleep(2)
            assert await redis_cluster.xlen(key) > before
            assert not writing.done(), "the burst should span the outage"
            await asyncio.to_thread(broker.start)
            await writing
            await wait_until(
                lambda: outbox_drained(redis_cluster, event_id), within=120, what="drain"
            )
            failures = sum(
                s.value
                for m in relay.metrics.send_failures.collect()
                for s in m.samples
                if s.name.endswith("_total")
            )
            recreations = metric(relay, "flashcoupon_relay_producer_recreations_total")
        assert failures > 0, "the relay never noticed the outage; the test did not test it"

        codes = codes_of(await read_all(bootstrap, topic))
        assert set(codes) == {c.code for c in coupons}  # none lost
        duplicates = len(codes) - len(set(codes))
        print(
            f"{len(coupons)} entries, {len(codes)} records, {duplicates} duplicates, "
            f"{failures:.0f} failed sends, {recreations:.0f} producer recreations"
        )
    finally:
        await cleanup_event(redis_cluster, event_id)
        await asyncio.to_thread(broker.stop)
        shutil.rmtree(broker.env["FLASHCOUPON_STACK_DIR"], ignore_errors=True)


async def _relayed_some(redis, key: str, written: int) -> bool:
    return await redis.xlen(key) < written
