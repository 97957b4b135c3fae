"""Issuer down: the breaker opens and the gateway answers 503 + Retry-After at once; when the
issuer comes back, a half-open probe closes the breaker again."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tests.support.gateway import assert_problem, bearer, provision
from tests.support.metrics import scraped
from tests.support.processes import gateway_proc, issuer_proc
from tests.support.stack import Stack


async def test_breaker_opens_while_issuer_is_down_and_recovers(
    stack: Stack, redis_cluster: Any
) -> None:
    spec = await provision(redis_cluster)
    path = f"/v1/events/{spec.event_id}/issue"
    issuer = issuer_proc(stack).start()
    gateway = gateway_proc(
        stack, issuer.url, breaker_failures="3", breaker_open_seconds="1.5"
    ).start()
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as c:
            assert (await c.post(path, headers=bearer("before"))).status_code == 201
            issuer.kill()
            failures = [await c.post(path, headers=bearer(f"down-{i}")) for i in range(3)]
            for r in failures:
                assert_problem(r, 503, "SERVICE_UNAVAILABLE")
                assert int(r.headers["retry-after"]) >= 1
            text = (await c.get("/metrics")).text
            assert scraped(text, "flashcoupon_gateway_breaker_state", upstream=issuer.url) == 2
            shed_before = scraped(text, "flashcoupon_gateway_shed_total", reason="breaker_open")
            for i in range(5):
                r = await c.post(path, headers=bearer(f"open-{i}"))
                assert_problem(r, 503, "SERVICE_UNAVAILABLE")
                assert "retry later" in r.json()["detail"] and int(r.headers["retry-after"]) >= 1
            text = (await c.get("/metrics")).text
            # Answered by the open breaker, without trying the dead upstream.
            assert (
                scraped(text, "flashcoupon_gateway_shed_total", reason="breaker_open")
                == shed_before + 5
            )

            issuer.start()  # same port
            await asyncio.sleep(1.6)  # the open period ends: the next request is the probe
            r = await c.post(path, headers=bearer("after"))
            assert r.status_code == 201, r.text
            text = (await c.get("/metrics")).text
            assert scraped(text, "flashcoupon_gateway_breaker_state", upstream=issuer.url) == 0
            assert (await c.post(path, headers=bearer("after-2"))).status_code == 201
    finally:
        gateway.stop()
        issuer.stop()
