"""The persister as a process: SIGKILL mid-batch loses nothing; SIGTERM commits and leaves."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.names import random_name
from tests.support.persister import (
    codes,
    committed,
    count_rows,
    coupon,
    create_topic,
    delete_topics,
    end_offsets,
    engine_for,
    insert_event,
    produce_coupons,
)
from tests.support.polling import wait_until
from tests.support.processes import Persister
from tests.support.stack import Stack

TOTAL = 30_000


@pytest.fixture
async def setup(
    stack: Stack, kafka_topic: str, mysql_url: str
) -> AsyncIterator[tuple[dict[str, str], str, str, str, AsyncEngine]]:
    dlq = await create_topic(stack.kafka.bootstrap, 1, prefix="dlq")
    group = random_name("g")
    event = random_name("ev")
    engine = engine_for(mysql_url)
    await insert_event(engine, event)
    env = {
        **stack.env(),
        "FLASHCOUPON_MYSQL_URL": mysql_url,
        "FLASHCOUPON_PERSISTER_TOPIC": kafka_topic,
        "FLASHCOUPON_PERSISTER_DLQ_TOPIC": dlq,
        "FLASHCOUPON_PERSISTER_GROUP_ID": group,
        # Small batches and a slow start make "mid-batch" easy to hit.
        "FLASHCOUPON_PERSISTER_MAX_BATCH": "300",
    }
    yield env, group, event, kafka_topic, engine
    await engine.dispose()
    await delete_topics(stack.kafka.bootstrap, dlq)


async def _drained(bootstrap: str, group: str, topic: str) -> bool:
    return await committed(bootstrap, group, topic) == await end_offsets(bootstrap, topic)


async def test_sigkill_mid_batch_then_restart_loses_and_doubles_nothing(
    stack: Stack, setup: tuple, tmp_path: Path
) -> None:
    env, group, event, topic, engine = setup
    bootstrap = stack.kafka.bootstrap
    batch = [coupon(event, n) for n in range(TOTAL)]
    await produce_coupons(bootstrap, topic, batch)

    first = Persister(env, tmp_path / "persister.log")
    try:
        assert await wait_until(lambda: count_rows_ge(engine, event, 2_000), 60, 0.05)
        first.kill()
    finally:
        first.cleanup()
    stored_at_kill = await count_rows(engine, event)
    offsets_at_kill = sum(max(0, o) for o in (await committed(bootstrap, group, topic)).values())
    assert stored_at_kill < TOTAL, "the kill came too late to be mid-stream"

    second = Persister(env, tmp_path / "persister.log")
    try:
        assert await wait_until(lambda: _drained(bootstrap, group, topic), 120)
        assert await wait_until(second.ready, 30)
        async with httpx.AsyncClient() as client:
            base = f"http://127.0.0.1:{second.port}"
            health = await client.get(f"{base}/healthz")
            text = (await client.get(f"{base}/metrics")).text
        assert health.status_code == 200
        for name in (
            "flashcoupon_persister_rows_total",
            "flashcoupon_persister_batch_size_bucket",
            "flashcoupon_persister_db_write_seconds_bucket",
            f'flashcoupon_persister_consumer_lag{{partition="0",topic="{topic}"}}',
        ):
            assert name in text, name
        second.terminate()
    finally:
        second.cleanup()
    assert await codes(engine, event) == sorted(c.code for c in batch)
    print(f"killed with {stored_at_kill} rows stored, {offsets_at_kill} offsets committed")


async def count_rows_ge(engine: AsyncEngine, event: str, n: int) -> bool:
    return await count_rows(engine, event) >= n


async def test_sigterm_finishes_the_batch_commits_and_leaves_the_group(
    stack: Stack, setup: tuple, tmp_path: Path
) -> None:
    env, group, event, topic, engine = setup
    bootstrap = stack.kafka.bootstrap
    await produce_coupons(bootstrap, topic, [coupon(event, n) for n in range(TOTAL)])

    proc = Persister(env, tmp_path / "persister.log")
    try:
        assert await wait_until(lambda: count_rows_ge(engine, event, 2_000), 60, 0.05)
        code = proc.terminate()
    finally:
        proc.cleanup()
    log = (tmp_path / "persister.log").read_text()
    assert code in (0, -signal.SIGTERM, 128 + signal.SIGTERM), log[-2000:]
    # Everything stored is committed, and nothing committed is missing: the batch in flight
    # at SIGTERM was finished and its offsets committed before the process left.
    stored = await count_rows(engine, event)
    done = sum(max(0, o) for o in (await committed(bootstrap, group, topic)).values())
    assert stored == done, (stored, done)
    assert stored < TOTAL, "SIGTERM came after the end of the stream; nothing in flight"

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    print("describe:", described, "exit code:", code)
    state = described.groups[0][2] if hasattr(described, "groups") else described
    assert state in ("Empty", b"Empty"), described
