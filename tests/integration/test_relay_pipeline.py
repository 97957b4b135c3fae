"""The outbox relay against the real Redis Cluster and Kafka: outbox entries become records.

Entries are written exactly as the issuer's script writes them (CouponIssued.to_outbox fields
XADDed to keys.outbox_key, the id SADDed to keys.EVENTS_REGISTRY). Each test has its own event
id and its own topic, and its relays are restricted to that event (settings.events) so they
never take entries of tests running beside them. The helpers are in tests/support/relay.py
(shared with the relay benchmark through flashcoupon_loadtest.outbox).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator

import orjson
import pytest
from flashcoupon_common import keys
from flashcoupon_common.kafka_admin import create_topics
from flashcoupon_common.messages import CouponIssued
from flashcoupon_relay.app import create_app
from flashcoupon_relay.relay import Relay

from tests.support.asgi import app_client
from tests.support.metrics import scraped
from tests.support.names import random_name
from tests.support.polling import wait_until
from tests.support.relay import (
    cleanup_event,
    codes_of,
    make_coupons,
    metric,
    outbox_drained,
    read_all,
    register,
    relay_settings,
    running,
    write_outbox,
)

# ----------------------------------------------------------------------------- helpers


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture
async def event(redis_cluster) -> AsyncIterator[str]:
    event_id = random_name("rel")
    await register(redis_cluster, event_id)
    yield event_id
    await cleanup_event(redis_cluster, event_id)


@pytest.fixture
async def topic(stack) -> str:
    name = random_name("t-relay")
    await create_topics(stack.kafka.bootstrap, name, name + "-dlq")
    return name


# ----------------------------------------------------------------------------- tests


async def test_every_entry_becomes_one_record_keyed_by_user(
    stack, redis_cluster, event, topic
) -> None:
    coupons = make_coupons(event, 600, users=200)  # 3 coupons per user
    await write_outbox(redis_cluster, coupons)
    relay = Relay(relay_settings(stack.env(), event, topic, batch_size=100), redis_cluster)
    async with running(relay):
        await wait_until(lambda: outbox_drained(redis_cluster, event), within=60, what="drain")
        assert metric(relay, "flashcoupon_relay_relayed_total", event=event) == 600

    records = await read_all(stack.kafka.bootstrap, topic)
    decoded = [CouponIssued.decode(r.value) for r in records]
    assert sorted(decoded, key=lambda c: c.code) == coupons  # exactly these, each once
    by_user: dict[str, list[int]] = {}
    for r, c in zip(records, decoded, strict=True):
        assert r.key == c.user_id.encode()
        headers = dict(r.headers)
        assert headers["event-id"] == event.encode()
        assert headers["request-id"] == c.request_id.encode()
        assert headers["traceparent"].startswith(b"00-")
        by_user.setdefault(c.user_id, []).append(c.seq)
    # One user's coupons share a partition, in the order they were issued.
    assert all(seqs == sorted(seqs) for seqs in by_user.values())
    assert await redis_cluster.xlen(keys.outbox_key(event)) == 0  # acked AND deleted


async def test_a_trickle_of_entries_is_relayed_in_few_batches(
    stack, redis_cluster, event, topic
) -> None:
    # RELAY_GATHER_MS: after a short read the relay waits for entries to gather, so a steady
    # trickle (a drop's issuers) goes out in a few batches, not one per entry or two.
    gather_s = 0.25
    relay = Relay(
        relay_settings(stack.env(), event, topic, gather_ms=int(gather_s * 1000)), redis_cluster
    )
    coupons = make_coupons(event, 60)
    async with running(relay):
        await wait_until(lambda: event in relay.watched_events(), within=30, what="watching")
        started = time.monotonic()
        for c in coupons:
            await write_outbox(redis_cluster, [c])
            await asyncio.sleep(0.005)
        trickle_s = time.monotonic() - started
        await wait_until(lambda: outbox_drained(redis_cluster, event), within=60, what="drain")
        assert metric(relay, "flashcoupon_relay_relayed_total", event=event) == 60
        batches = metric(relay, "flashcoupon_relay_batch_size_count")
    # One batch per gather window the trickle spanned, plus the first read and the tail.
    assert 1 <= batches <= trickle_s / gather_s + 3, (batches, trickle_s)
    records = await read_all(stack.kafka.bootstrap, topic)
    assert sorted(codes_of(records)) == sorted(c.code for c in coupons)


async def test_undecodable_entry_is_dead_lettered_and_does_not_block(
    stack, redis_cluster, event, topic
) -> None:
    coupons = make_coupons(event, 50)
    await write_outbox(redis_cluster, coupons[:25])
    await redis_cluster.xadd(keys.outbox_key(event), {"e": event, "u": "x", "s": "NaN"})
    await write_outbox(redis_cluster, coupons[25:])
    relay = Relay(relay_settings(stack.env(), event, topic, batch_size=10), redis_cluster)
    async with running(relay):
        await wait_until(lambda: outbox_drained(redis_cluster, event), within=60, what="drain")
        assert metric(relay, "flashcoupon_relay_dlq_total", event=event) == 1
    records = await read_all(stack.kafka.bootstrap, topic)
    assert sorted(codes_of(records)) == [c.code for c in coupons]
    (letter,) = await read_all(stack.kafka.bootstrap, topic + "-dlq")
    body = orjson.loads(letter.value)
    assert body["fields"] == {"e": event, "u": "x", "s": "NaN"} and body["eventId"] == event
    headers = dict(letter.headers)
    assert headers["error-code"] == b"OUTBOX_UNDECODABLE"
    assert b"outbox entry" in headers["error-detail"]


async def test_entries_pending_on_a_dead_consumer_are_claimed(
    stack, redis_cluster, event, topic
) -> None:
    coupons = make_coupons(event, 120)
    await write_outbox(redis_cluster, coupons)
    key = keys.outbox_key(event)
    await redis_cluster.xgroup_create(key, keys.RELAY_GROUP, id="0")
    # A relay that read 70 entries and died before sending them.
    taken = await redis_cluster.xreadgroup(keys.RELAY_GROUP, "dead-relay", {key: ">"}, count=70)
    assert len(taken[0][1]) == 70
    relay = Relay(relay_settings(stack.env(), event, topic, claim_idle_ms=500), redis_cluster)
    async with running(relay):
        await wait_until(lambda: outbox_drained(redis_cluster, event), within=60, what="drain")
        assert metric(relay, "flashcoupon_relay_claimed_total", event=event) == 70
    records = await read_all(stack.kafka.bootstrap, topic)
    assert sorted(codes_of(records)) == [c.code for c in coupons]


async def test_gauges_show_entries_stuck_on_a_dead_relay(
    stack, redis_cluster, event, topic
) -> None:
    await write_outbox(redis_cluster, make_coupons(event, 50))
    key = keys.outbox_key(event)
    await redis_cluster.xgroup_create(key, keys.RELAY_GROUP, id="0")
    await redis_cluster.xreadgroup(keys.RELAY_GROUP, "dead-relay", {key: ">"}, count=20)
    await asyncio.sleep(1.1)  # entry ids carry their write time: make the ages measurable
    relay = Relay(relay_settings(stack.env(), event, topic, claim_idle_ms=600_000), redis_cluster)

    async def gauges_settled() -> bool:
        return (
            metric(relay, "flashcoupon_relay_outbox_length", event=event) == 20
            and metric(relay, "flashcoupon_relay_outbox_pending", event=event) == 20
        )

    async with running(relay):
        await wait_until(gauges_settled, within=30, what="gauges")
        # The 30 free entries were relayed; the 20 held by the dead relay wait for a claim.
        assert metric(relay, "flashcoupon_relay_relayed_total", event=event) == 30
        assert metric(relay, "flashcoupon_relay_outbox_oldest_age_seconds", event=event) >= 1
        pending_age = "flashcoupon_relay_outbox_oldest_pending_age_seconds"
        assert metric(relay, pending_age, event=event) >= 1


async def test_restarted_relay_redelivers_its_own_pending_entries_first(
    stack, redis_cluster, event, topic
) -> None:
    coupons = make_coupons(event, 40)
    await write_outbox(redis_cluster, coupons)
    key = keys.outbox_key(event)
    await redis_cluster.xgroup_create(key, keys.RELAY_GROUP, id="0")
    await redis_cluster.xreadgroup(keys.RELAY_GROUP, "pod-a-1", {key: ">"}, count=40)
    # Same consumer name after a restart; claiming is far away, so only "own pending" helps.
    settings = relay_settings(stack.env(), event, topic, consumer="pod-a-1", claim_idle_ms=600_000)
    relay = Relay(settings, redis_cluster)
    async with running(relay):
        await wait_until(lambda: outbox_drained(redis_cluster, event), within=30, what="drain")
        assert metric(relay, "flashcoupon_relay_claimed_total", event=event) == 0
    records = await read_all(stack.kafka.bootstrap, topic)
    assert sorted(codes_of(records)) == [c.code for c in coupons]


async def test_kafka_unreachable_nothing_acked_and_shutdown_is_bounded(
    stack, redis_cluster, event
) -> None:
    with socket.socket() as sock:  # a port nothing listens on: Kafka "down"
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    env = {**stack.env(), "FLASHCOUPON_KAFKA_BOOTSTRAP": dead}
    settings = relay_settings(env, event, "t-never", shutdown_grace_ms=1000, backoff_max_ms=200)
    await write_outbox(redis_cluster, make_coupons(event, 30))
    relay = Relay(settings, redis_cluster)
    task = asyncio.create_task(relay.run())
    key = keys.outbox_key(event)

    async def holding() -> bool:
        with contextlib.suppress(Exception):
            return (await redis_cluster.xpending(key, keys.RELAY_GROUP))["pending"] == 30
        return False

    await wait_until(holding, within=20, what="relay reading")
    await asyncio.sleep(1)  # several failed attempts
    assert metric(relay, "flashcoupon_relay_relayed_total", event=event) == 0
    assert await redis_cluster.xlen(key) == 30  # nothing deleted, nothing acknowledged
    assert (await relay.ready())["kafka"] is False
    started = time.monotonic()
    relay.stop()
    await asyncio.wait_for(task, 20)
    assert time.monotonic() - started < 10  # grace 1 s + block + producer teardown
    summary = await redis_cluster.xpending(key, keys.RELAY_GROUP)
    assert summary["pending"] == 30  # left pending for another relay (or a restart)


async def test_several_relays_share_one_stream_without_loss_or_duplicates(
    stack, redis_cluster, event, topic
) -> None:
    coupons = make_coupons(event, 1500)
    relays = [
        Relay(relay_settings(stack.env(), event, topic, batch_size=50), redis_cluster)
        for _ in range(3)
    ]
    async with running(relays[0]), running(relays[1]), running(relays[2]):
        await write_outbox(redis_cluster, coupons, chunk=100)
        await wait_until(lambda: outbox_drained(redis_cluster, event), within=60, what="drain")
        total = sum(metric(r, "flashcoupon_relay_relayed_total", event=event) for r in relays)
    assert total == 1500
    records = await read_all(stack.kafka.bootstrap, topic)
    # Nothing failed, so the group hands each entry to exactly one relay: no duplicates.
    assert sorted(codes_of(records)) == [c.code for c in coupons]


async def test_one_relay_serves_several_events_found_in_the_registry(
    stack, redis_cluster, topic
) -> None:
    events = [random_name("rel") for _ in range(3)]
    coupons = {e: make_coupons(e, 200) for e in events}
    relay = Relay(
        relay_settings(stack.env(), events[0], topic, events=tuple(events)), redis_cluster
    )
    try:
        async with running(relay):
            for e in events:  # registered one after another, while the relay runs
                await write_outbox(redis_cluster, coupons[e])
                await register(redis_cluster, e)
            for e in events:
                await wait_until(lambda e=e: outbox_drained(redis_cluster, e), within=30, what=e)
            assert relay.watched_events() == set(events)
        codes = sorted(codes_of(await read_all(stack.kafka.bootstrap, topic)))
        assert codes == sorted(c.code for e in events for c in coupons[e])
    finally:
        for e in events:
            await cleanup_event(redis_cluster, e)


async def test_removed_event_is_drained_then_forgotten(stack, redis_cluster, event, topic) -> None:
    settings = relay_settings(stack.env(), event, topic)
    relay = Relay(settings, redis_cluster)
    async with running(relay):
        await wait_until(lambda: _watching(relay, event), within=10, what="discovery")
        await write_outbox(redis_cluster, make_coupons(event, 30))
        await redis_cluster.srem(keys.EVENTS_REGISTRY, event)  # deleted with entries left
        await wait_until(lambda: _not_watching(relay, event), within=30, what="retire")
    records = await read_all(stack.kafka.bootstrap, topic)
    assert len(set(codes_of(records))) == 30
    assert await redis_cluster.xlen(keys.outbox_key(event)) == 0


async def _watching(relay: Relay, event_id: str) -> bool:
    return event_id in relay.watched_events()


async def _not_watching(relay: Relay, event_id: str) -> bool:
    return event_id not in relay.watched_events()


async def test_app_serves_readiness_and_metrics_while_relaying(stack, redis_cluster) -> None:
    event_id = random_name("rel")
    topic = random_name("t-relay")
    await create_topics(stack.kafka.bootstrap, topic, topic + "-dlq")
    settings = relay_settings(stack.env(), event_id, topic)
    async with app_client(create_app(settings)) as client:
        await register(redis_cluster, event_id)
        await write_outbox(redis_cluster, make_coupons(event_id, 20))
        try:

            async def relayed_all() -> bool:
                text = (await client.get("/metrics")).text
                return scraped(text, "flashcoupon_relay_relayed_total", event=event_id) == 20

            await wait_until(relayed_all, within=30, what="20 records relayed")
            ready = await client.get("/readyz")
            assert ready.status_code == 200
            assert ready.json()["checks"] == {"redis": True, "kafka": True}
            assert (await client.get("/healthz")).status_code == 200
        finally:
            await cleanup_event(redis_cluster, event_id)


async def test_producer_is_rebuilt_once_per_generation_after_a_fatal_error(stack) -> None:
    from aiokafka.errors import OutOfOrderSequenceNumber
    from flashcoupon_common.kafka_producer import ProducerHolder
    from flashcoupon_relay.metrics import RelayMetrics
    from flashcoupon_relay.producer import relay_producer_factory

    settings = relay_settings(stack.env(), "unused", random_name("t-relay"))
    metrics = RelayMetrics()
    holder = ProducerHolder(
        relay_producer_factory(settings), on_recreate=metrics.producer_recreations.inc
    )
    try:
        first, gen = await holder.get()
        assert first._txn_manager is not None and first._sender._acks == -1  # idempotent, all
        # Three streams hit the same fatal error at once: one rebuild, not three.
        fatal = OutOfOrderSequenceNumber()
        await asyncio.gather(*(holder.recreate(gen, fatal) for _ in range(3)))
        second, gen2 = await holder.get()
        assert second is not first and gen2 == gen + 1
        assert (
            metrics.registry.get_sample_value("flashcoupon_relay_producer_recreations_total") == 1
        )
        await holder.recreate(gen, fatal)  # a late report about the old producer: ignored
        assert (await holder.get())[0] is second
        assert await holder.ready()
    finally:
        await holder.close()
