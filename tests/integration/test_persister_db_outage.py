"""MariaDB stopped for 20 s under a stream of records: nothing lost, nothing doubled.

Uses a private MariaDB (its own data dir and port) so stopping it touches no other test.
"""

from __future__ import annotations

import asyncio
import time

import httpx
from flashcoupon_common.db.migrate import upgrade
from flashcoupon_persister import metrics
from flashcoupon_persister.app import create_app
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.conftest import Stack, random_name
from tests.persister_support import (
    codes,
    committed,
    coupon,
    create_topic,
    delete_topics,
    end_offsets,
    insert_event,
    produce_coupons,
    read_all,
    settings_for,
    wait_until,
)
from tests.private_stack import private_mariadb

TOTAL = 2400
CHUNK = 60


async def test_database_outage_loses_nothing_and_lag_drains(stack: Stack) -> None:
    bootstrap = stack.kafka.bootstrap
    db, url = private_mariadb()
    await asyncio.to_thread(db.start)
    topic = await create_topic(bootstrap, 3)
    dlq = await create_topic(bootstrap, 1, prefix="dlq")
    engine = create_async_engine(url, pool_pre_ping=True)
    try:
        await asyncio.to_thread(upgrade, url)
        event = random_name("ev")
        await insert_event(engine, event)
        await engine.dispose()  # its pooled connections die with the server anyway
        batch = [coupon(event, n) for n in range(TOTAL)]
        group = random_name("g")
        retries_before = metrics.RETRIES.labels("db")._value.get()

        async def stream() -> None:
            # ~40 s of traffic: before, during and after the outage.
            for i in range(0, TOTAL, CHUNK):
                await produce_coupons(bootstrap, topic, batch[i : i + CHUNK])
                await asyncio.sleep(1.0)

        settings = settings_for(
            bootstrap, url, topic, dlq, group, retry_backoff_base_s=0.2, retry_backoff_cap_s=2.0
        )
        app = create_app(settings)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://p")
        async with app.router.lifespan_context(app), http:

            async def ready() -> bool:
                return (await http.get("/readyz")).status_code == 200

            producer = asyncio.create_task(stream())
            assert await wait_until(ready, 20)
            await asyncio.sleep(3)
            await asyncio.to_thread(db.stop)
            await asyncio.sleep(5)
            unready = await http.get("/readyz")
            assert unready.status_code == 503
            assert unready.json()["checks"] == {"database": False, "assigned": True}
            await asyncio.sleep(15)
            await asyncio.to_thread(db.start)
            restarted = time.monotonic()
            await producer
            stream_ended = time.monotonic()

            async def drained() -> bool:
                return await committed(bootstrap, group, topic) == await end_offsets(
                    bootstrap, topic
                )

            assert await wait_until(drained, 90)
            drain_s = time.monotonic() - restarted
            tail_s = time.monotonic() - stream_ended

            def lags() -> list[float]:
                return [
                    s.value
                    for m in metrics.LAG.collect()
                    for s in m.samples
                    if s.labels.get("topic") == topic
                ]

            async def lag_zero() -> bool:  # the gauges refresh about once a second
                return len(lags()) == 3 and all(v == 0 for v in lags())

            assert await wait_until(lag_zero, 10), lags()
            assert await ready()
        print(f"lag 0 {drain_s:.1f}s after the restart, {tail_s:.1f}s after the last record")
        retries = metrics.RETRIES.labels("db")._value.get() - retries_before
        # Retried, but with backoff: at most write_concurrency batches, each capped at 2 s
        # delays over ~20 s, is a few dozen attempts; a busy loop would be thousands.
        print(f"{retries:.0f} db retries during the outage")
        assert 0 < retries < 150, retries
        stored = await codes(engine, event)
        assert stored == sorted(c.code for c in batch)  # every one, each once
        async with engine.connect() as conn:
            n = (await conn.execute(text("SELECT COUNT(*) FROM user_coupons"))).scalar_one()
        assert n == TOTAL
        assert await read_all(bootstrap, dlq, 1, within=2) == []
    finally:
        await engine.dispose()
        await delete_topics(bootstrap, topic, dlq)
        await asyncio.to_thread(db.stop)
