"""Redis frozen (SIGSTOP): the gateway's, the issuer's and the relay's /readyz answer 503
within their 2 s bound, however often asked, and 200 again after the thaw.

A frozen server still completes TCP handshakes in its kernel but never answers, as a hung
server or a partition without RST. The clients set no socket timeout, so an unbounded PING
never returns (redis-py sends it to the client's default node; every node is frozen here).
Before the readiness checks ran in `flashcoupon_common.probes.redis_probe`, the gateway's and
the issuer's /readyz hung with it, and a kubelet's every probe left one more.
Uses a private Redis Cluster so freezing it touches no other test.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from tests.support.polling import wait_until
from tests.support.private_stack import private_redis
from tests.support.processes import Proc, gateway_proc, issuer_proc, start_relay, wait_ready
from tests.support.stack import Stack

BOUND_S = 2.0  # the probes' timeout_s
ASKED = 3  # /readyz calls per service while frozen


async def unready_within_bound(http: httpx.AsyncClient, url: str) -> list[float]:
    """Each /readyz while frozen: 503 with redis false; the seconds each answer took."""
    took = []
    for _ in range(ASKED):
        start = time.monotonic()
        r = await http.get(f"{url}/readyz")
        took.append(time.monotonic() - start)
        assert r.status_code == 503, r.text
        assert r.json()["checks"]["redis"] is False, r.text
    return took


async def ready(http: httpx.AsyncClient, url: str) -> bool:
    return (await http.get(f"{url}/readyz")).status_code == 200


@pytest.mark.timeout(180)  # a hang must fail the test, not stall the suite
async def test_readiness_is_bounded_while_redis_hangs(stack: Stack, tmp_path: Path) -> None:
    server, ports = private_redis(nodes=3, replicas=0)
    await asyncio.to_thread(server.start)
    nodes = ",".join(f"127.0.0.1:{p}" for p in ports)
    procs: list[Proc] = []
    relay = None
    try:
        issuer = issuer_proc(stack)
        issuer.env["FLASHCOUPON_REDIS_NODES"] = nodes
        procs.append(issuer)
        gateway = gateway_proc(stack, issuer.url)
        gateway.env["FLASHCOUPON_REDIS_NODES"] = nodes
        procs.append(gateway)
        for proc in procs:
            await asyncio.to_thread(proc.start)
        relay, relay_port = start_relay(
            {**stack.env(), "FLASHCOUPON_REDIS_NODES": nodes}, tmp_path / "relay.log"
        )
        await wait_ready(f"http://127.0.0.1:{relay_port}", relay)
        urls = {
            "issuer": issuer.url,
            "gateway": gateway.url,
            "relay": f"http://127.0.0.1:{relay_port}",
        }

        # Far above the bound, so only a /readyz that hangs fails here, as a ReadTimeout.
        async with httpx.AsyncClient(timeout=BOUND_S + 8) as http:
            for url in urls.values():
                assert await ready(http, url)
            for port in ports:
                server.freeze(port)
            try:
                took = {name: await unready_within_bound(http, url) for name, url in urls.items()}
            finally:
                for port in ports:
                    server.thaw(port)
            print(f"/readyz while frozen took (s): {took}")
            for name, url in urls.items():
                assert await wait_until(lambda url=url: ready(http, url), 20), name
    finally:
        for proc in procs:
            proc.stop()
        if relay is not None and relay.poll() is None:
            relay.terminate()
            relay.wait(10)
        await asyncio.to_thread(server.stop)
