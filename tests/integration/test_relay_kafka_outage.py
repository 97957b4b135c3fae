"""Kafka stopped in the middle of a burst: issuance keeps answering 201, nothing is lost.

The burst goes through the issuer app (its lifespan really runs; requests through its routes,
batcher and Lua script) against the shared Redis Cluster; the relay sends to a private Kafka
broker (tests/private_stack.py) that this test stops and starts — the shared broker is never
touched. While the broker is down the issuer keeps issuing (it does not need Kafka), the
outbox grows, the relay retries without acknowledging; after the broker is back, every coupon
answered 201 is on the topic at least once. Duplicates are allowed and reported.
"""

from __future__ import annotations

import asyncio
import collections
import shutil

from flashcoupon_common import event_state, keys
from flashcoupon_common.kafka_admin import create_topics
from flashcoupon_issuer.app import create_app
from flashcoupon_issuer.settings import IssuerSettings
from flashcoupon_relay.relay import Relay

from tests.conftest import random_name
from tests.integration.test_issuer_app import ISSUE, asgi_post
from tests.integration.test_issuer_app import running as running_app
from tests.integration.test_issuer_script import make_spec
from tests.integration.test_relay_pipeline import (
    codes_of,
    metric,
    outbox_drained,
    read_all,
    relay_settings,
    running,
    wait_until,
)
from tests.private_stack import private_kafka

SHOPPERS = 3000


async def test_kafka_stopped_during_a_burst_issuance_answers_and_nothing_is_lost(
    stack, redis_cluster
) -> None:
    broker, bootstrap = private_kafka()
    await asyncio.to_thread(broker.start)
    spec = make_spec(SHOPPERS)
    event_id, topic = spec.event_id, random_name("t-relay")
    key = keys.outbox_key(event_id)
    statuses: collections.Counter[int] = collections.Counter()
    answered: set[str] = set()  # coupon codes shoppers were told they hold
    try:
        await create_topics(bootstrap, topic, topic + "-dlq")
        await event_state.provision(redis_cluster, spec)  # registers the event, as in prod
        env = {**stack.env(), "FLASHCOUPON_KAFKA_BOOTSTRAP": bootstrap}
        settings = relay_settings(
            env, event_id, topic, batch_size=200, delivery_timeout_ms=4000, backoff_max_ms=1000
        )
        relay = Relay(settings, redis_cluster)
        issuer = create_app(IssuerSettings(redis=stack.redis))
        async with running_app(issuer) as app, running(relay):

            async def shopper(i: int) -> None:
                status, body = await asgi_post(
                    app, ISSUE.format(event_id), {"X-Flashcoupon-User": f"shopper-{i}"}
                )
                statuses[status] += 1
                if status == 201:
                    answered.add(body["couponCode"])

            async def burst(first: int, last: int, pause: float) -> None:
                for i in range(first, last, 50):
                    await asyncio.gather(*(shopper(j) for j in range(i, min(i + 50, last))))
                    await asyncio.sleep(pause)

            await burst(0, 600, 0.05)
            await wait_until(
                lambda: _relayed_some(redis_cluster, key, 600), within=30, what="first records"
            )
            # ~20 s of requests: before the stop, while the broker is down, after it is back.
            shoppers = asyncio.create_task(burst(600, SHOPPERS, 0.4))
            await asyncio.to_thread(broker.stop)
            before = await redis_cluster.xlen(key)
            await asyncio.sleep(2)
            # Broker down: coupons keep being issued into the outbox (it is the buffer).
            assert await redis_cluster.xlen(key) > before
            assert not shoppers.done(), "the burst should span the outage"
            await asyncio.to_thread(broker.start)
            await shoppers
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

        assert statuses == {201: SHOPPERS}  # issuance never depended on Kafka
        assert failures > 0, "the relay never noticed the outage; the test did not test it"
        codes = codes_of(await read_all(bootstrap, topic))
        assert set(codes) == answered  # every 201 reached Kafka; nothing else did
        duplicates = len(codes) - len(set(codes))
        print(
            f"{SHOPPERS} coupons answered 201, {len(codes)} records, {duplicates} duplicates, "
            f"{failures:.0f} failed sends, {recreations:.0f} producer recreations"
        )
    finally:
        await event_state.delete_state(redis_cluster, event_id)
        await asyncio.to_thread(broker.stop)
        shutil.rmtree(broker.env["FLASHCOUPON_STACK_DIR"], ignore_errors=True)


async def _relayed_some(redis, key: str, written: int) -> bool:
    return await redis.xlen(key) < written
