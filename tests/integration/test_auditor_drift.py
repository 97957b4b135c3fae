"""The auditor against the real pipeline: issue.lua in Redis, the real persister into MariaDB.

An event is provisioned and issued into with the issuer's own script; its outbox entries go to
a test topic the real persister consumes. Then one MySQL row is deleted and one Redis record
removed; `flashcoupon-auditor` (run as a process, the way an operator runs it) must report
exactly one missing and one extra, and `--repair` must send the missing record back through
Kafka so the persister restores it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from flashcoupon_common import event_state, keys
from flashcoupon_common.db.schema import user_coupons
from flashcoupon_common.kafka_admin import create_topics, delete_topics
from flashcoupon_common.messages import CouponIssued
from flashcoupon_common.settings import MysqlSettings
from flashcoupon_persister.bootstrap import running
from flashcoupon_persister.settings import PersisterSettings
from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.issuer import issue_coupons
from tests.support.names import random_name
from tests.support.stack import Stack
from tests.support.wallet import add_event

N = 20


async def relay_outbox(redis: Any, stack: Stack, event_id: str, topic: str) -> int:
    """What the relay does, inline: outbox entries → Kafka, keyed by user."""
    entries = await redis.xrange(keys.outbox_key(event_id))
    producer = AIOKafkaProducer(bootstrap_servers=stack.kafka.bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        for _, fields in entries:
            rec = CouponIssued.from_outbox(fields)
            await producer.send_and_wait(topic, rec.encode(), key=rec.kafka_key())
    finally:
        await producer.stop()
    return len(entries)


async def count_rows(engine: AsyncEngine, event_id: str) -> int:
    async with engine.connect() as conn:
        query = select(func.count()).where(user_coupons.c.event_id == event_id)
        return int(await conn.scalar(query) or 0)


async def wait_rows(engine: AsyncEngine, event_id: str, want: int, wait_s: float = 60) -> int:
    deadline = time.monotonic() + wait_s
    for _ in range(int(wait_s * 10)):
        got = await count_rows(engine, event_id)
        if got == want or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    return got


async def auditor(stack: Stack, mysql_url: str, *args: str) -> tuple[int, dict[str, Any]]:
    env = {**stack.env(), "FLASHCOUPON_MYSQL_URL": mysql_url}
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "flashcoupon_persister.auditor_cli", "--json", *args],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr.decode()
    return proc.returncode, orjson.loads(proc.stdout)


async def test_auditor_finds_drift_and_repair_restores_the_missing_row(
    stack: Stack, redis_cluster: Any, mysql_url: str, mysql_engine: AsyncEngine, kafka_topic: str
) -> None:
    spec = await issue_coupons(redis_cluster, N)
    eid = spec.event_id
    dlq = random_name("dlq")
    await create_topics(stack.kafka.bootstrap, dlq, partitions=1)
    settings = PersisterSettings(
        kafka=stack.kafka,
        mysql=MysqlSettings(mysql_url),
        group_id=random_name("g"),
        topic=kafka_topic,
        dlq_topic=dlq,
    )
    try:
        await add_event(mysql_engine, eid)
        async with running(settings):
            assert await relay_outbox(redis_cluster, stack, eid, kafka_topic) == N
            assert await wait_rows(mysql_engine, eid, N) == N

            code, body = await auditor(
                stack, mysql_url, "--event", eid, "--repair", "--topic", kafka_topic
            )
            report = body["events"][0]
            assert code == 0 and body["clean"], body
            assert (report["redis"], report["mysql"], report["republished"]) == (N, N, 0)

            # Drift both ways: user-3's row leaves MySQL, user-7's record leaves Redis.
            async with mysql_engine.begin() as conn:
                await conn.execute(
                    delete(user_coupons).where(
                        user_coupons.c.event_id == eid, user_coupons.c.user_id == "user-3"
                    )
                )
            held = await redis_cluster.hget(keys.users_key(eid), "user-7")
            assert held is not None
            await redis_cluster.hdel(keys.users_key(eid), "user-7")
            issued = {c.user_id: c async for c in event_state.iter_issued(redis_cluster, eid)}

            code, body = await auditor(stack, mysql_url, "--event", eid, "--examples", "3")
            report = body["events"][0]
            assert code == 1 and not body["clean"]
            assert (report["missing"], report["extra"], report["mismatched"]) == (1, 1, 0)
            assert report["examples"]["missing"] == [
                {
                    "userId": "user-3",
                    "seq": 1,
                    "code": issued["user-3"].code,
                    "tier": issued["user-3"].tier,
                }
            ]
            assert [x["userId"] for x in report["examples"]["extra"]] == ["user-7"]
            assert report["republished"] is None  # no --repair: nothing sent
            assert await count_rows(mysql_engine, eid) == N - 1

            code, body = await auditor(
                stack, mysql_url, "--event", eid, "--repair", "--topic", kafka_topic
            )
            assert code == 1 and body["events"][0]["republished"] == 1
            # the persister writes it back; the extra row stays (the auditor never deletes)
            assert await wait_rows(mysql_engine, eid, N) == N
            async with mysql_engine.connect() as conn:
                restored = (
                    await conn.execute(
                        select(user_coupons.c.code, user_coupons.c.tier).where(
                            user_coupons.c.event_id == eid, user_coupons.c.user_id == "user-3"
                        )
                    )
                ).one()
            assert tuple(restored) == (issued["user-3"].code, issued["user-3"].tier)

            code, body = await auditor(stack, mysql_url, "--event", eid)
            report = body["events"][0]
            assert (code, report["missing"], report["extra"], report["mismatched"]) == (1, 0, 1, 0)
            # put user-7's record back in Redis: now the event is clean again
            await redis_cluster.hset(keys.users_key(eid), "user-7", held)
            code, body = await auditor(stack, mysql_url, "--event", eid)
            assert code == 0 and body["clean"], body
    finally:
        await event_state.delete_state(redis_cluster, eid)
        await delete_topics(stack.kafka.bootstrap, dlq)


async def test_auditor_refuses_an_event_without_redis_state(stack: Stack) -> None:
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "flashcoupon_persister.auditor_cli", "--event", "no-such-ev"],
        env=stack.env(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert b"no runtime state in Redis" in proc.stderr
    assert proc.stdout == b""
