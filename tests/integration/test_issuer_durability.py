"""durability=replica: every 201 the issuer answered survives the death of the master.

A private Redis Cluster (tests/private_stack.py) is used, because the test SIGKILLs the master
owning the event's slot while shoppers keep asking. With `replica`, a coupon is answered only
after `WAIT 1` confirmed a replica has it; the replica is promoted, so each answered coupon
must be found in the promoted node's state. Answers during the failover may be 503 (the
client retries with its Idempotency-Key) but never a 201 that is later missing.
"""

from __future__ import annotations

import asyncio
import collections
import shutil
import time
from pathlib import Path

from flashcoupon_common import event_state, keys
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import RedisSettings
from flashcoupon_issuer.app import create_app
from flashcoupon_issuer.settings import IssuerSettings

from tests.integration.test_issuer_app import ISSUE, asgi_post, running
from tests.integration.test_issuer_script import make_spec
from tests.private_stack import private_redis


async def test_replica_durability_survives_master_kill() -> None:
    server, ports = private_redis()
    await asyncio.to_thread(server.start)
    redis_settings = RedisSettings(nodes=tuple(("127.0.0.1", p) for p in ports))
    client = create_redis_cluster(redis_settings)
    try:
        await client.initialize()
        spec = make_spec(1_000_000)
        await event_state.provision(client, spec)
        eid = spec.event_id
        master = client.nodes_manager.get_node_from_slot(client.keyslot(keys.config_key(eid)))
        settings = IssuerSettings(
            redis=redis_settings, durability="replica", wait_timeout_ms=500, retry_deadline_s=20
        )
        answered: dict[str, str] = {}  # user → code of every 201
        statuses: collections.Counter[int] = collections.Counter()
        async with running(create_app(settings)) as app:

            async def shopper(user: str) -> None:
                headers = {"X-Flashcoupon-User": user, "Idempotency-Key": f"k-{user}"}
                status, body = await asgi_post(app, ISSUE.format(eid), headers)
                statuses[status] += 1
                if status == 201:
                    answered[user] = body["couponCode"]

            async def wave(n: int) -> None:
                await asyncio.gather(*(shopper(f"{n}-{i}") for i in range(50)))

            for n in range(10):  # steady traffic before the crash
                await wave(n)
            before = len(answered)
            await asyncio.to_thread(server.kill, master.port)
            n = 10
            crash_end = time.monotonic() + 8  # failover takes ~cluster-node-timeout (3 s)
            while time.monotonic() < crash_end:
                await wave(n)
                n += 1
            # The promoted replica has no replica of its own, so WAIT 1 cannot succeed until
            # the dead node returns (as the new master's replica): until then every issue
            # answers 503 NOT_DURABLE, never an unconfirmed 201.
            during = len(answered)
            restarted = time.monotonic()
            await asyncio.to_thread(server.start)
            deadline = time.monotonic() + 30
            resumed: float | None = None
            while time.monotonic() < deadline and len(answered) < before + 200:
                await wave(n)
                n += 1
                if resumed is None and len(answered) > during:
                    resumed = time.monotonic()
            print(
                f"\nreplica/fail: {during - before} coupons answered in the 8 s after the kill; "
                f"first 201 {resumed - restarted if resumed else float('nan'):.1f} s after the "
                "old master was restarted"
            )
            # Shoppers told 503 retry with their Idempotency-Key and get their coupon.
            refused = [
                u for u in {f"{w}-{i}" for w in range(n) for i in range(50)} if u not in answered
            ]
            await asyncio.gather(*(shopper(u) for u in refused))
        assert before == 500
        assert len(answered) > before + 200, f"issuance did not resume: {statuses}"
        assert set(statuses) <= {201, 503}, statuses
        assert statuses[503] > 0, "the kill did not hit the event's master"
        assert len(answered) == n * 50, "a retried shopper did not get a coupon"
        held = {c.user_id: c.code async for c in event_state.iter_issued(client, eid)}
        lost = {u: c for u, c in answered.items() if held.get(u) != c}
        assert not lost, f"{len(lost)} answered coupons lost in the failover"
    finally:
        await client.aclose()
        await asyncio.to_thread(server.stop)
        shutil.rmtree(Path(server.env["FLASHCOUPON_STACK_DIR"]), ignore_errors=True)


async def test_replica_durability_degrades_to_none_when_configured() -> None:
    """UNCONFIRMED=degrade: after a failover the promoted master has no replica, and issuing
    goes on unconfirmed (counted) instead of answering 503 until the old master rejoins."""
    from flashcoupon_issuer import metrics

    server, ports = private_redis()
    await asyncio.to_thread(server.start)
    redis_settings = RedisSettings(nodes=tuple(("127.0.0.1", p) for p in ports))
    client = create_redis_cluster(redis_settings)
    try:
        await client.initialize()
        spec = make_spec(1_000_000)
        await event_state.provision(client, spec)
        eid = spec.event_id
        master = client.nodes_manager.get_node_from_slot(client.keyslot(keys.config_key(eid)))
        settings = IssuerSettings(
            redis=redis_settings,
            durability="replica",
            unconfirmed="degrade",
            wait_timeout_ms=500,
            retry_deadline_s=20,
        )
        statuses: collections.Counter[int] = collections.Counter()
        unconfirmed_before = metrics.UNCONFIRMED._value.get()
        async with running(create_app(settings)) as app:

            async def wave(n: int) -> int:
                async def one(i: int) -> int:
                    h = {"X-Flashcoupon-User": f"{n}-{i}", "Idempotency-Key": f"k-{n}-{i}"}
                    status, _ = await asgi_post(app, ISSUE.format(eid), h)
                    statuses[status] += 1
                    return status

                return sum(s == 201 for s in await asyncio.gather(*(one(i) for i in range(20))))

            for n in range(3):
                assert await wave(n) == 20
            killed = time.monotonic()
            await asyncio.to_thread(server.kill, master.port)
            n, resumed = 3, None
            while time.monotonic() < killed + 30 and resumed is None:
                if await wave(n):
                    resumed = time.monotonic()
                n += 1
            assert resumed is not None, (
                f"issuance did not resume without the old master: {statuses}"
            )
            assert await wave(n + 1) == 20  # steady again, the old master still dead
        print(f"\nreplica/degrade: first 201 {resumed - killed:.1f} s after the kill; {statuses}")
        assert metrics.UNCONFIRMED._value.get() > unconfirmed_before
    finally:
        await client.aclose()
        await asyncio.to_thread(server.stop)
        shutil.rmtree(Path(server.env["FLASHCOUPON_STACK_DIR"]), ignore_errors=True)
