"""MariaDB stopped under a stream of records until readiness reports writes stuck (past
STALL_GRACE_S), then restarted: nothing lost, nothing doubled.

Uses a private MariaDB (its own data dir and port) so stopping it touches no other test.
"""

from __future__ import annotations

import asyncio
import time

import httpx
from flashcoupon_persister.consumer import STALL_GRACE_S

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

TOTAL = 2400
CHUNK = 60


async def stored_at_least(rig: FaultRig, n: int) -> bool:
    return await count_rows(rig.engine, rig.event) >= n


async def readiness_is(http: httpx.AsyncClient, checks: dict[str, bool]) -> bool:
    """/readyz answers 503 with exactly these checks."""
    r = await http.get("/readyz")
    return r.status_code == 503 and r.json()["checks"] == checks


async def test_database_outage_loses_nothing_and_lag_drains(stack: Stack) -> None:
    async with fault_rig(stack.kafka.bootstrap) as rig:
        batch = [coupon(rig.event, n) for n in range(TOTAL)]
        retries_before = sample("flashcoupon_persister_retries_total", what="db")
        settings = rig.settings(retry_backoff_base_s=0.2, retry_backoff_cap_s=2.0)
        async with persister_http(settings) as http:
            # ~40 s of traffic: before, during and after the outage.
            producer = asyncio.create_task(rig.stream(batch, CHUNK, 1.0))
            assert await wait_until(lambda: is_ready(http), 20)
            # Rows are being written before the outage (the stream's first chunks stored).
            await wait_until(lambda: stored_at_least(rig, CHUNK), 20, what="rows before the stop")
            await asyncio.to_thread(rig.db.stop)
            checks = {"database": False, "assigned": True, "writing": True}
            await wait_until(lambda: readiness_is(http, checks), 20, what="database unready")
            # Failing for longer than STALL_GRACE_S now: readiness says writes are stuck too.
            stuck = {**checks, "writing": False}
            await wait_until(lambda: readiness_is(http, stuck), 20 + STALL_GRACE_S, what="stuck")
            await asyncio.to_thread(rig.db.start)
            restarted = time.monotonic()
            await producer
            stream_ended = time.monotonic()

            await rig.wait_drained(90)
            drain_s = time.monotonic() - restarted
            tail_s = time.monotonic() - stream_ended
            assert await is_ready(http)
        print(f"lag 0 {drain_s:.1f}s after the restart, {tail_s:.1f}s after the last record")
        retries = sample("flashcoupon_persister_retries_total", what="db") - retries_before
        # Retried, but with backoff: at most write_concurrency batches, each capped at 2 s
        # delays over ~20 s, is a few dozen attempts; a busy loop would be thousands.
        print(f"{retries:.0f} db retries during the outage")
        assert 0 < retries < 150, retries
        await rig.assert_stored_once(batch)
