"""A Redis master killed mid-burst, through the gateway and issuer processes (issue 10, item 5).

The contract for 503 (docs/gateway.md, docs/issuer.md): "retry; you will learn your coupon".
A 503 may be indeterminate — the script can run on the master while the answer is lost — but
then a retry returns that coupon: 201 with the same code for the same Idempotency-Key, 409
DUPLICATE carrying the code without one. And the deadlines are consistent: the issuer answers
before the gateway stops waiting, so a shopper is not told 503 while the issuer goes on to
issue for seconds afterwards, and the issuer's 503s during a failover open no breaker.

Everything runs on a private Redis Cluster (tests/private_stack.py), which the test kills and
stops itself; the gateway's rate limits live on the same cluster, as in production.
"""

from __future__ import annotations

import asyncio
import collections
import shutil
import time
from pathlib import Path

import httpx
from flashcoupon_common import event_state, keys
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import RedisSettings

from tests.conftest import Stack
from tests.e2e.test_gateway_breaker import metric
from tests.e2e.test_gateway_e2e import BIN, SECRET, Proc, bearer, free_port, provision
from tests.private_stack import private_redis

QUANTITY = 2000
SHOPPERS = 6000
WORKERS = 48
KILL_AFTER = 500  # coupons answered before the master dies


async def test_failover_503s_are_few_and_every_held_coupon_is_learned_on_retry(
    stack: Stack,
) -> None:
    server, ports = private_redis()
    await asyncio.to_thread(server.start)
    nodes = ",".join(f"127.0.0.1:{p}" for p in ports)
    env = {**stack.env(), "FLASHCOUPON_REDIS_NODES": nodes}
    redis = create_redis_cluster(RedisSettings.from_env(env))
    issuer = Proc([str(BIN / "flashcoupon-issuer")], env, free_port())
    gateway_env = {
        **env,
        "FLASHCOUPON_GATEWAY_JWT_SECRET": SECRET,
        "FLASHCOUPON_GATEWAY_ISSUER_URLS": issuer.url,
        "FLASHCOUPON_GATEWAY_IP_PER_SECOND": "100000",
        "FLASHCOUPON_GATEWAY_IP_BURST": "100000",
    }
    gateway = Proc([str(BIN / "flashcoupon-gateway")], gateway_env, free_port())
    try:
        await redis.initialize()
        spec = await provision(redis, quantity=QUANTITY)
        eid = spec.event_id
        path = f"/v1/events/{eid}/issue"
        master = redis.nodes_manager.get_node_from_slot(redis.keyslot(keys.config_key(eid)))
        await asyncio.to_thread(issuer.start)
        await asyncio.to_thread(gateway.start)

        answers: dict[str, httpx.Response] = {}
        statuses: collections.Counter[int] = collections.Counter()
        issued = 0
        killed_at: float | None = None
        queue: asyncio.Queue[str] = asyncio.Queue()
        for i in range(SHOPPERS):
            queue.put_nowait(f"s{i}")

        async with httpx.AsyncClient(
            base_url=gateway.url,
            timeout=30,
            limits=httpx.Limits(max_connections=WORKERS, max_keepalive_connections=WORKERS),
        ) as http:

            async def worker() -> None:
                nonlocal issued, killed_at
                while not queue.empty():
                    user = queue.get_nowait()
                    r = await http.post(path, headers={**bearer(user), "Idempotency-Key": user})
                    answers[user] = r
                    statuses[r.status_code] += 1
                    issued += r.status_code == 201
                    if killed_at is None and issued >= KILL_AFTER:
                        killed_at = time.monotonic()
                        server.kill(master.port)

            await asyncio.gather(*(worker() for _ in range(WORKERS)))
            assert killed_at is not None, statuses
            gateway_metrics = (await http.get("/metrics")).text

            # What Redis holds once the cluster is whole again (the promoted replica).
            held: dict[str, str] = {}
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    held = {c.user_id: c.code async for c in event_state.iter_issued(redis, eid)}
                    break
                except Exception:  # the slot map is still settling
                    await asyncio.sleep(0.5)
                    await redis.nodes_manager.initialize()
            unavailable = [u for u, r in answers.items() if r.status_code == 503]
            indeterminate = [u for u in unavailable if u in held]
            shed = "flashcoupon_gateway_shed_total"
            print(
                f"\nfailover burst: {dict(statuses)}; 503s {len(unavailable)}, of which "
                f"{len(indeterminate)} held a coupon (per {QUANTITY} coupons); "
                f"breaker_open sheds {metric(gateway_metrics, shed, 'breaker_open'):.0f}, "
                f"upstream timeouts {metric(gateway_metrics, shed, 'upstream_timeout'):.0f}"
            )
            # Nothing answered 201 is missing (durability=none may lose the last writes of a
            # crashed master; here every 201 was answered by a master whose writes replicated
            # or by the promoted replica — a loss would be reported, not hidden).
            lost = [u for u, r in answers.items() if r.status_code == 201 and u not in held]
            # Every 503'd holder learns the coupon on retry, with and without the key.
            wrong: list[tuple[str, int, str]] = []
            for user in indeterminate:
                keyed = await http.post(path, headers={**bearer(user), "Idempotency-Key": user})
                if keyed.status_code != 201 or keyed.json()["couponCode"] != held[user]:
                    wrong.append((user, keyed.status_code, keyed.text[:120]))
                bare = await http.post(path, headers=bearer(user))
                if (
                    bare.status_code != 409
                    or bare.json()["code"] != "DUPLICATE"
                    or bare.json()["coupon"]["couponCode"] != held[user]
                ):
                    wrong.append((user, bare.status_code, bare.text[:120]))

        assert not wrong, f"{len(wrong)} retries did not return the held coupon: {wrong[:5]}"
        assert len(held) <= QUANTITY
        assert len(lost) <= 64, f"{len(lost)} answered coupons missing after the failover"
        assert statuses[503] > 0, "the kill did not hit the event's master"
        # A failover opens no breaker: the issuer's 503s are answers, not failures.
        assert metric(gateway_metrics, "flashcoupon_gateway_shed_total", "breaker_open") == 0
        assert metric(gateway_metrics, "flashcoupon_gateway_shed_total", "upstream_timeout") == 0
        # Far below the ~470 per 2,000 coupons the issue measured; a handful at most (the
        # scripts on the wire when the master died whose replies were lost).
        assert len(indeterminate) <= 50, len(indeterminate)
    finally:
        gateway.stop()
        issuer.stop()
        await redis.aclose()
        await asyncio.to_thread(server.stop)
        shutil.rmtree(Path(server.env["FLASHCOUPON_STACK_DIR"]), ignore_errors=True)
