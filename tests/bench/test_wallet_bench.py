"""Wallet throughput: redemptions/s vs the same process answering /healthz (printed, not asserted).

    uv run pytest tests/bench/test_wallet_bench.py -s -q

The wallet runs as its own process (one uvicorn worker); this process drives it with C
concurrent keep-alive connections through the load driver's raw HTTP/1.1 client (httpx would
be the bottleneck). Three figures in one run:
- healthz: the HTTP stack's ceiling for this client/server pair (no I/O behind it);
- redeem: N distinct coupons redeemed (read + conditional UPDATE + outbox INSERT, one commit;
  the publisher sends them to Kafka in the background);
- contended: C concurrent redemptions of ONE code with different orders (1 winner, C-1 × 409).
FLASHCOUPON_BENCH_WALLET_N (default 2000) and FLASHCOUPON_BENCH_WALLET_C (default 32).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import orjson
from flashcoupon_common.db.schema import user_coupons
from flashcoupon_loadtest.http1 import Connection, Target, build_request
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import Stack, random_name
from tests.e2e.test_wallet_process import wait_ready
from tests.integration.test_wallet_api import USER, add_coupon, add_event, free_port

N = int(os.environ.get("FLASHCOUPON_BENCH_WALLET_N", "2000"))
C = int(os.environ.get("FLASHCOUPON_BENCH_WALLET_C", "32"))


async def insert_coupons(engine: AsyncEngine, event_id: str, n: int) -> list[str]:
    now = datetime.now(UTC).replace(tzinfo=None)
    rows = [
        {
            "event_id": event_id,
            "user_id": f"user-{i}",
            "seq": 1,
            "code": f"B{i:09d}",
            "tier": "big",
            "discount_type": "fixed",
            "amount": 1000,
            "issued_at": now,
            "expires_at": now + timedelta(days=1),
            "request_id": f"r{i}",
        }
        for i in range(n)
    ]
    async with engine.begin() as conn:
        await conn.execute(insert(user_coupons), rows)
    return [r["code"] for r in rows]


async def drive(target: Target, requests: list[bytes]) -> float:
    """Send pre-built requests over C keep-alive connections; returns requests per second."""
    queue = list(reversed(requests))

    async def worker() -> None:
        conn = Connection(target)
        try:
            while queue:
                status, _, body = await conn.request(queue.pop())
                assert status in (200, 409), body
        finally:
            conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(C)))
    return len(requests) / (time.perf_counter() - started)


def cpu_seconds(pid: int) -> float:
    """user+system CPU of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redeem_request(target: Target, code: str, user: str, order: str) -> bytes:
    body = orjson.dumps({"orderId": order, "orderAmount": 5000})
    headers = {USER: user, "Content-Type": "application/json"}
    return build_request(target, "POST", f"/v1/coupons/{code}/redeem", headers, body)


async def test_wallet_throughput(
    stack: Stack, mysql_url: str, mysql_engine: AsyncEngine, kafka_topic: str
) -> None:
    event = random_name("bench")
    await add_event(mysql_engine, event)
    codes = await insert_coupons(mysql_engine, event, N)
    hot = await add_coupon(mysql_engine, event, "hot-user")
    port = free_port()
    env = {
        **stack.env(),
        "FLASHCOUPON_MYSQL_URL": mysql_url,
        "FLASHCOUPON_WALLET_REDEEMED_TOPIC": kafka_topic,
        "FLASHCOUPON_WALLET_LOG_LEVEL": "WARNING",
    }
    proc = subprocess.Popen(  # noqa: ASYNC220 - returns at once
        [sys.executable, "-m", "flashcoupon_wallet", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, proc)
        target = Target.parse(url)
        healthz = await drive(target, [build_request(target, "GET", "/healthz")] * N)
        requests = [
            redeem_request(target, code, f"user-{i}", f"o-{i}") for i, code in enumerate(codes)
        ]
        cpu0 = cpu_seconds(proc.pid)
        redeem = await drive(target, requests)
        cpu_ms_per_redeem = (cpu_seconds(proc.pid) - cpu0) * 1000 / N
        started = time.perf_counter()
        conns = [Connection(target) for _ in range(C)]
        answers = await asyncio.gather(
            *(
                conn.request(redeem_request(target, hot, "hot-user", f"h-{i}"))
                for i, conn in enumerate(conns)
            )
        )
        contended_s = time.perf_counter() - started
        for conn in conns:
            conn.close()
        assert sorted(status for status, _, _ in answers) == [200] + [409] * (C - 1)
        async with httpx.AsyncClient(base_url=url) as c:
            r = await c.get(f"/v1/events/{event}/persisted")
            assert r.json()["redeemed"] == N + 1
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 30)
    result = {
        "n": N,
        "concurrency": C,
        "healthz_per_s": round(healthz),
        "redeem_per_s": round(redeem),
        "redeem_vs_healthz": round(redeem / healthz, 3),
        "contended_one_code_ms": round(contended_s * 1000, 1),
        "wallet_cpu_ms_per_redeem": round(cpu_ms_per_redeem, 2),
    }
    print("\nwallet bench:", orjson.dumps(result).decode())
