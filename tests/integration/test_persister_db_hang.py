"""MariaDB frozen (SIGSTOP) under a stream of records until the hang is handled: writes time
out, are retried, partitions pause; after the thaw everything is stored once.

A frozen server still completes TCP handshakes in its kernel but never answers, which is what
a hung database or a partition without RST looks like. Without a write timeout the batches in
flight wait forever, nothing is retried or counted, and the partitions are not even paused.
Uses a private MariaDB so freezing it touches no other test.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from flashcoupon_persister.writer import BatchWriter, WriteTimeout
from sqlalchemy import event as sa_event
from sqlalchemy.ext.asyncio import create_async_engine

from tests.support.metrics import sample
from tests.support.persister import (
    FaultRig,
    count_rows,
    coupon,
    fault_rig,
    is_ready,
    persister_http,
)
from tests.support.polling import wait_until
from tests.support.stack import Stack

TOTAL = 1200
CHUNK = 60
FROZEN_S = 8.0  # the longest each consequence of the freeze may take to show


async def stored_at_least(rig: FaultRig, n: int) -> bool:
    return await count_rows(rig.engine, rig.event) >= n


async def not_ready(http: httpx.AsyncClient) -> bool:
    return not await is_ready(http)


@pytest.mark.timeout(120)  # a hang must fail the test, not stall the suite for 300 s
async def test_hung_database_times_out_retries_and_recovers(stack: Stack) -> None:
    async with fault_rig(stack.kafka.bootstrap) as rig:
        batch = [coupon(rig.event, n) for n in range(TOTAL)]
        settings = rig.settings(
            db_write_timeout_s=1.0, retry_backoff_base_s=0.2, retry_backoff_cap_s=1.0
        )
        async with persister_http(settings) as http:
            # ~15 s of traffic: before, during and after the freeze.
            producer = asyncio.create_task(rig.stream(batch, CHUNK, 0.75))
            assert await wait_until(lambda: is_ready(http), 20)
            # Rows are being written before the freeze (the stream's first chunks stored).
            await wait_until(lambda: stored_at_least(rig, CHUNK), 20, what="rows before the freeze")
            timeouts_before = sample("flashcoupon_persister_db_timeouts_total")
            retries_before = sample("flashcoupon_persister_retries_total", what="db")

            def hang_handled() -> bool:
                """The hang was noticed, counted, retried, and the partitions paused."""
                timeouts = sample("flashcoupon_persister_db_timeouts_total") - timeouts_before
                retries = sample("flashcoupon_persister_retries_total", what="db") - retries_before
                paused = sample("flashcoupon_persister_paused")
                return timeouts > 0 and retries >= timeouts and paused == 1

            rig.db.freeze()
            try:
                await wait_until(lambda: not_ready(http), FROZEN_S, what="unready while frozen")
                await wait_until(hang_handled, FROZEN_S, what="timeouts, retries, paused")
                # Still frozen: the hang was noticed, counted, and the partitions paused.
                retries = sample("flashcoupon_persister_retries_total", what="db") - retries_before
                paused = sample("flashcoupon_persister_paused")
                timeouts = sample("flashcoupon_persister_db_timeouts_total") - timeouts_before
            finally:
                rig.db.thaw()
            thawed = time.monotonic()
            print(f"while frozen: {timeouts:.0f} timeouts, {retries:.0f} retries, paused={paused}")
            assert timeouts > 0
            assert retries >= timeouts
            assert paused == 1
            await producer

            await rig.wait_drained(30)
            print(f"lag 0 {time.monotonic() - thawed:.1f}s after the thaw")
            assert await is_ready(http)  # the same loop, never restarted
        await rig.assert_stored_once(batch)


@pytest.mark.timeout(60)
async def test_write_timeout_discards_the_connection(stack: Stack) -> None:
    async with fault_rig(stack.kafka.bootstrap) as rig:
        engine = create_async_engine(rig.url, pool_size=2, pool_pre_ping=True)
        invalidated: list[object] = []
        sa_event.listen(
            engine.sync_engine.pool, "invalidate", lambda c, r, e: invalidated.append(c)
        )
        writer = BatchWriter(engine, timeout_s=1.0)
        try:
            await writer.write([coupon(rig.event, n) for n in range(10)])  # pools a connection
            second = [coupon(rig.event, n) for n in range(10, 20)]
            rig.db.freeze()
            try:
                started = time.monotonic()
                with pytest.raises(WriteTimeout):
                    await writer.write(second)
                took = time.monotonic() - started
            finally:
                rig.db.thaw()
            assert 1.0 <= took < 5.0, took  # the 1 s timeout, not the freeze (slack: busy CI)
            # The connection it was using is gone, not back in the pool mid-transaction.
            assert invalidated
            assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
            result = await writer.write(second)
            # The timed-out transaction may still commit: its last statement can reach the
            # server before SIGSTOP takes hold (the signal lands a moment after kill returns
            # on a busy machine), and is read from the socket on the thaw. The retry then
            # finds those rows as duplicates (writer.py). Either way each record is stored once.
            assert result.rejected == [] and result.inserted + result.duplicates == 10, result
            assert await count_rows(rig.engine, rig.event) == 20
        finally:
            await engine.dispose()
