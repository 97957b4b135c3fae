"""Redis Cluster unreachable at runtime: the gateway answers 503 + Retry-After, never a 500,
and its readiness says so; it recovers when Redis is back."""

from __future__ import annotations

import asyncio

import httpx

from tests.support.gateway import assert_problem, bearer
from tests.support.private_stack import private_redis
from tests.support.processes import gateway_proc
from tests.support.stack import Stack


async def test_redis_down_is_503_not_500(stack: Stack) -> None:
    server, ports = private_redis(nodes=3, replicas=0)
    await asyncio.to_thread(server.start)
    gateway = None
    try:
        gateway = gateway_proc(stack, "http://127.0.0.1:9")
        gateway.env["FLASHCOUPON_REDIS_NODES"] = ",".join(f"127.0.0.1:{p}" for p in ports)
        await asyncio.to_thread(gateway.start)
        async with httpx.AsyncClient(base_url=gateway.url, timeout=15) as c:
            # Redis up: the limits pass and the (absent) issuer is what fails.
            r = await c.post("/v1/events/no-such-event/issue", headers=bearer("alice"))
            assert_problem(r, 503, "SERVICE_UNAVAILABLE")
            assert "issuer" in r.json()["detail"]
            await asyncio.to_thread(server.stop)
            for user in ("bob", "carol"):
                r = await c.post("/v1/events/no-such-event/issue", headers=bearer(user))
                assert_problem(r, 503, "SERVICE_UNAVAILABLE")
                assert "rate-limit store" in r.json()["detail"] and r.headers["retry-after"]
            assert (await c.get("/readyz")).status_code == 503
            assert (await c.get("/healthz")).status_code == 200
            await asyncio.to_thread(server.start)  # same nodes, same slots
            for _ in range(100):
                r = await c.post("/v1/events/no-such-event/issue", headers=bearer("dave"))
                if "issuer" in r.json()["detail"]:
                    break
                await asyncio.sleep(0.2)
            assert "issuer" in r.json()["detail"], r.text  # past the limits again
            assert (await c.get("/readyz")).status_code == 200
    finally:
        if gateway is not None:
            gateway.stop()
        await asyncio.to_thread(server.stop)
