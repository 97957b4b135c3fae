"""The outbox relay against the real Redis Cluster and Kafka: outbox entries become records.

Entries are written exactly as the issuer's script writes them (CouponIssued.to_outbox fields
XADDed to keys.outbox_key, the id SADDed to keys.EVENTS_REGISTRY). Each test has its own event
id and its own topic, and its relays are restricted to that event (settings.events) so they
never take entries of tests running beside them. The helpers here are used by the other relay
test modules too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time
from collections.abc import AsyncIterator, Iterable

import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from flashcoupon_common import keys
from flashcoupon_common.kafka_admin import create_topics
from flashcoupon_common.messages import CouponIssued, Discount
from flashcoupon_relay.app import create_app
from flashcoupon_relay.relay import Relay
from flashcoupon_relay.settings import RelaySettings
from starlette.testclient import TestClient

from tests.conftest import random_name

# ----------------------------------------------------------------------------- helpers


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


async def register(redis, event_id: str) -> None:
    await redis.sadd(keys.EVENTS_REGISTRY, event_id)


async def write_outbox(redis, coupons: Iterable[CouponIssued], *, chunk: int = 500) -> None:
    """XADD the entries in pipelined chunks (what the issuer's script does one at a time)."""
    coupons = list(coupons)
    for start in range(0, len(coupons), chunk):
        async with redis.pipeline() as pipe:
            for c in coupons[start : start + chunk]:
                fields = c.to_outbox()
                fields["tp"] = f"00-{c.code.encode().hex()[-32:]:0>32}-{'1' * 16}-01"
                pipe.xadd(keys.outbox_key(c.event_id), fields)
            await pipe.execute()


async def cleanup_event(redis, event_id: str) -> None:
    await redis.srem(keys.EVENTS_REGISTRY, event_id)
    await redis.delete(keys.outbox_key(event_id))


async def read_all(bootstrap: str, topic: str, *, within: float = 60) -> list:
    """Every record of the topic, from the beginning up to its end offsets at call time.

    An outbox entry is deleted only after Kafka acknowledged its record, so once the outbox
    is drained every record is below the end offsets: this read is complete, not a sample.
    """
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    records: list = []
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


def codes_of(records: list) -> list[str]:
    return [CouponIssued.decode(r.value).code for r in records]


async def wait_until(check, *, within: float, interval: float = 0.2, what: str = "") -> None:
    deadline = time.monotonic() + within
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what or check}")
        await asyncio.sleep(interval)


async def outbox_drained(redis, event_id: str) -> bool:
    key = keys.outbox_key(event_id)
    if await redis.xlen(key):
        return False
    return (await redis.xpending(key, keys.RELAY_GROUP))["pending"] == 0


def relay_settings(bootstrap_env: dict[str, str], event_id: str, topic: str, **kw) -> RelaySettings:
    base = RelaySettings.from_env(bootstrap_env)
    options = {
        "consumer": random_name("relay"),
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
    task = asyncio.create_task(relay.run())
    try:
        yield relay
    finally:
        relay.stop()
        await asyncio.wait_for(task, 30)


def metric(relay: Relay, name: str, **labels: str) -> float:
    return relay.metrics.registry.get_sample_value(name, labels) or 0.0


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


def test_app_serves_readiness_and_metrics_while_relaying(stack, request) -> None:
    """Sync test: TestClient runs the app (and its lifespan) on a loop of its own."""
    event_id = random_name("rel")
    topic = random_name("t-relay")

    async def setup(redis) -> None:
        await create_topics(stack.kafka.bootstrap, topic, topic + "-dlq")
        await register(redis, event_id)
        await write_outbox(redis, make_coupons(event_id, 20))

    settings = relay_settings(stack.env(), event_id, topic)
    app = create_app(settings)
    with TestClient(app) as client:
        redis = app.state.relay._redis  # the app's own client, bound to its loop
        client.portal.call(setup, redis)
        try:
            deadline = time.monotonic() + 30
            body = ""
            while time.monotonic() < deadline:
                body = client.get("/metrics").text
                if f'flashcoupon_relay_relayed_total{{event="{event_id}"}} 20.0' in body:
                    break
                time.sleep(0.2)
            assert f'flashcoupon_relay_relayed_total{{event="{event_id}"}} 20.0' in body
            ready = client.get("/readyz")
            assert ready.status_code == 200
            assert ready.json()["checks"] == {"redis": True, "kafka": True}
            assert client.get("/healthz").status_code == 200
        finally:
            client.portal.call(cleanup_event, redis, event_id)


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
