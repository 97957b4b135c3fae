"""Relays as processes (the way they run in pods): one is SIGKILLed holding a batch it read
but never acknowledged; another relay claims those entries and nothing is lost."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import httpx
from flashcoupon_common import keys
from flashcoupon_common.kafka_admin import create_topics
from flashcoupon_common.messages import CouponIssued
from redis.exceptions import ResponseError

from tests.support.names import random_name
from tests.support.polling import wait_until
from tests.support.processes import start_relay
from tests.support.relay import (
    cleanup_event,
    codes_of,
    make_coupons,
    outbox_drained,
    read_all,
    register,
    write_outbox,
)


async def pending_of(redis, key: str, consumer: str) -> int:
    try:
        summary = await redis.xpending(key, keys.RELAY_GROUP)
    except ResponseError:  # no group yet: the relay has not started reading
        return 0
    by_name = {c["name"].decode(): c["pending"] for c in summary["consumers"]}
    return by_name.get(consumer, 0)


async def test_sigkilled_relay_batch_is_claimed_by_another(stack, redis_cluster, tmp_path) -> None:
    event_id, topic = random_name("rel"), random_name("t-relay")
    await create_topics(stack.kafka.bootstrap, topic, topic + "-dlq")
    await register(redis_cluster, event_id)
    coupons = make_coupons(event_id, 4000, users=1000)
    await write_outbox(redis_cluster, coupons)
    key = keys.outbox_key(event_id)
    common = {"topic": topic, "dlq_topic": topic + "-dlq", "events": event_id, "batch_size": "500"}
    log = tmp_path / "relays.log"
    procs: list[subprocess.Popen] = []
    try:
        # Relay A lingers a whole second before each produce request, so it nearly always
        # holds a batch that it read but Kafka has not acknowledged yet.
        a, _ = start_relay(stack.env(), log, consumer="relay-a", linger_ms="1000", **common)
        procs.append(a)

        async def a_relayed_some_and_holds_a_batch() -> bool:
            assert a.poll() is None, log.read_text()
            if await redis_cluster.xlen(key) > len(coupons) - 1000:
                return False
            return await pending_of(redis_cluster, key, "relay-a") > 0

        await wait_until(
            a_relayed_some_and_holds_a_batch, within=60, interval=0.05, what="relay A working"
        )
        await asyncio.sleep(0.3)  # inside the linger: sent to the producer, not acknowledged
        a.send_signal(signal.SIGKILL)
        assert a.wait(10) == -signal.SIGKILL
        stranded = await pending_of(redis_cluster, key, "relay-a")
        assert stranded > 0, "relay A acknowledged everything before dying; nothing to claim"
        relayed_by_a = len(coupons) - await redis_cluster.xlen(key)

        b, b_port = start_relay(
            stack.env(),
            log,
            consumer="relay-b",
            claim_idle_ms="1000",
            claim_interval_ms="300",
            **common,
        )
        procs.append(b)
        await wait_until(
            lambda: outbox_drained(redis_cluster, event_id), within=90, what="relay B draining"
        )
        assert await pending_of(redis_cluster, key, "relay-a") == 0
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{b_port}") as http:
            metrics = (await http.get("/metrics")).text
        claimed = _sample(metrics, f'flashcoupon_relay_claimed_total{{event="{event_id}"}}')
        assert claimed >= stranded

        records = await read_all(stack.kafka.bootstrap, topic)
        codes = codes_of(records)
        assert set(codes) == {c.code for c in coupons}  # none lost
        duplicates = len(codes) - len(set(codes))
        print(
            f"A relayed {relayed_by_a} then died holding {stranded}; B claimed {claimed:.0f}; "
            f"{duplicates} duplicate records in Kafka"
        )

        # Graceful stop: SIGTERM runs the lifespan shutdown (in-flight batch, producer stop).
        # uvicorn re-raises the signal once shut down, so the exit status is -SIGTERM.
        b.send_signal(signal.SIGTERM)
        assert b.wait(30) in (0, -signal.SIGTERM)
        assert '"relay relay-b stopped"' in log.read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        await cleanup_event(redis_cluster, event_id)


def _sample(metrics_text: str, series: str) -> float:
    for line in metrics_text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not in /metrics")


def test_relay_refuses_bad_settings_with_the_variable_name(stack, tmp_path) -> None:
    env = {**stack.env(), "FLASHCOUPON_RELAY_BATCH_SIZE": "zero"}
    out = subprocess.run(
        [sys.executable, "-m", "flashcoupon_relay"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "FLASHCOUPON_RELAY_BATCH_SIZE" in out.stdout + out.stderr


async def test_sigterm_finishes_the_batch_in_flight(stack, redis_cluster, tmp_path) -> None:
    event_id, topic = random_name("rel"), random_name("t-relay")
    await create_topics(stack.kafka.bootstrap, topic, topic + "-dlq")
    await register(redis_cluster, event_id)
    coupons = make_coupons(event_id, 3000)
    await write_outbox(redis_cluster, coupons)
    key = keys.outbox_key(event_id)
    log = tmp_path / "relay.log"
    relay, _ = start_relay(
        stack.env(),
        log,
        consumer="relay-c",
        topic=topic,
        dlq_topic=topic + "-dlq",
        events=event_id,
        batch_size="500",
        linger_ms="1000",  # every batch waits a second in the producer: SIGTERM lands mid-batch
    )
    try:

        async def holds_a_batch() -> bool:
            assert relay.poll() is None, log.read_text()
            return await pending_of(redis_cluster, key, "relay-c") > 0

        await wait_until(holds_a_batch, within=60, interval=0.05, what="relay reading")
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(30) in (0, -signal.SIGTERM)
        # The batch it held was sent and acknowledged before exiting, not left for a claim.
        assert await pending_of(redis_cluster, key, "relay-c") == 0
        remaining = await redis_cluster.xlen(key)
        assert 0 < remaining < len(coupons)  # it stopped reading new batches
        codes = set(codes_of(await read_all(stack.kafka.bootstrap, topic)))
        assert len(codes) == len(coupons) - remaining
        entries = await redis_cluster.xrange(key)
        still_there = {CouponIssued.from_outbox(fields).code for _, fields in entries}
        assert codes | still_there == {c.code for c in coupons}  # each either sent or kept
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.wait(10)
        await cleanup_event(redis_cluster, event_id)
