"""MariaDB stopped for 20 s under a stream of records: nothing lost, nothing doubled.

Uses a private MariaDB (its own data dir and port) so stopping it touches no other test.
"""

from __future__ import annotations

import asyncio
import time

from flashcoupon_persister import metrics

from tests.conftest import Stack
from tests.persister_support import coupon, fault_rig, is_ready, persister_http, wait_until

TOTAL = 2400
CHUNK = 60


async def test_database_outage_loses_nothing_and_lag_drains(stack: Stack) -> None:
    async with fault_rig(stack.kafka.bootstrap) as rig:
        batch = [coupon(rig.event, n) for n in range(TOTAL)]
        retries_before = metrics.RETRIES.labels("db")._value.get()
        settings = rig.settings(retry_backoff_base_s=0.2, retry_backoff_cap_s=2.0)
        async with persister_http(settings) as http:
            # ~40 s of traffic: before, during and after the outage.
            producer = asyncio.create_task(rig.stream(batch, CHUNK, 1.0))
            assert await wait_until(lambda: is_ready(http), 20)
            await asyncio.sleep(3)
            await asyncio.to_thread(rig.db.stop)
            await asyncio.sleep(5)
            unready = await http.get("/readyz")
            assert unready.status_code == 503
            checks = {"database": False, "assigned": True, "writing": True}
            assert unready.json()["checks"] == checks
            await asyncio.sleep(15)
            # Failing for longer than STALL_GRACE_S now: readiness says writes are stuck too.
            stuck = (await http.get("/readyz")).json()["checks"]
            assert stuck == {**checks, "writing": False}
            await asyncio.to_thread(rig.db.start)
            restarted = time.monotonic()
            await producer
            stream_ended = time.monotonic()

            await rig.wait_drained(90)
            drain_s = time.monotonic() - restarted
            tail_s = time.monotonic() - stream_ended
            assert await is_ready(http)
        print(f"lag 0 {drain_s:.1f}s after the restart, {tail_s:.1f}s after the last record")
        retries = metrics.RETRIES.labels("db")._value.get() - retries_before
        # Retried, but with backoff: at most write_concurrency batches, each capped at 2 s
        # delays over ~20 s, is a few dozen attempts; a busy loop would be thousands.
        print(f"{retries:.0f} db retries during the outage")
        assert 0 < retries < 150, retries
        await rig.assert_stored_once(batch)
