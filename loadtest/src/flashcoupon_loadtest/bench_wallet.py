"""Wallet throughput: redemptions/s vs the same process answering /healthz (printed, not asserted).

    uv run python -m flashcoupon_loadtest.bench_wallet

The wallet runs as its own process (one uvicorn worker); this process drives it with C
concurrent keep-alive connections through the load driver's raw HTTP/1.1 client (httpx would
be the bottleneck). Three figures in one run:
- healthz: the HTTP stack's ceiling for this client/server pair (no I/O behind it);
- redeem: N distinct coupons redeemed (read + conditional UPDATE + outbox INSERT, one commit;
  the publisher sends them to Kafka in the background);
- contended: C concurrent redemptions of ONE code with different orders (1 winner, C-1 × 409).
FLASHCOUPON_BENCH_WALLET_N (default 2000) and FLASHCOUPON_BENCH_WALLET_C (default 32). Uses a
fresh migrated database and a fresh topic on the local stack, dropped afterwards; the figures
go to loadtest/results/bench-wallet.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import orjson
from flashcoupon_common.db.schema import user_coupons
from flashcoupon_common.kafka_admin import create_topics, delete_topics
from flashcoupon_common.settings import KafkaSettings, MysqlSettings
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from flashcoupon_loadtest import localrun
from flashcoupon_loadtest.bench_persister import drop_database, fresh_database
from flashcoupon_loadtest.http1 import Connection, Target, build_request
from flashcoupon_loadtest.procstat import cpu_seconds

RESULTS = Path(__file__).resolve().parents[2] / "results"
USER = "X-Flashcoupon-User"  # the identity header the gateway sets
N = int(os.environ.get("FLASHCOUPON_BENCH_WALLET_N", "2000"))
C = int(os.environ.get("FLASHCOUPON_BENCH_WALLET_C", "32"))


async def insert_coupons(engine: AsyncEngine, event_id: str, n: int) -> list[str]:
    now = datetime.now(UTC).replace(tzinfo=None)
    codes = [f"B{i:09d}" for i in range(n)]
    rows: list[dict[str, object]] = [
        {
            "event_id": event_id,
            "user_id": f"user-{i}",
            "seq": 1,
            "code": codes[i],
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
    return codes


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


def redeem_request(target: Target, code: str, user: str, order: str) -> bytes:
    body = orjson.dumps({"orderId": order, "orderAmount": 5000})
    headers = {USER: user, "Content-Type": "application/json"}
    return build_request(target, "POST", f"/v1/coupons/{code}/redeem", headers, body)


async def insert_hot_coupon(engine: AsyncEngine, event_id: str, user: str) -> str:
    """One coupon every contended redemption goes for."""
    now = datetime.now(UTC).replace(tzinfo=None)
    code = "HOT" + uuid.uuid4().hex[:12].upper()
    async with engine.begin() as conn:
        await conn.execute(
            insert(user_coupons).values(
                event_id=event_id,
                user_id=user,
                seq=1,
                code=code,
                tier="big",
                discount_type="fixed",
                amount=10_000,
                issued_at=now,
                expires_at=now + timedelta(days=1),
                request_id="r-hot",
            )
        )
    return code


async def main_async() -> dict[str, float]:
    env = {**os.environ, **localrun.stack_env()}
    base_url = MysqlSettings.from_env(env).url
    bootstrap = KafkaSettings.from_env(env).bootstrap
    suffix = uuid.uuid4().hex[:10]
    database, event, topic = f"bench_wallet_{suffix}", f"bench-{suffix}", f"t-bench-{suffix}"
    mysql_url, engine = await fresh_database(base_url, database, event)
    await create_topics(bootstrap, topic)
    try:
        return await measure(env, mysql_url, engine, event, topic)
    finally:
        await engine.dispose()
        await delete_topics(bootstrap, topic)
        await drop_database(base_url, database)


async def measure(
    env: dict[str, str], mysql_url: str, engine: AsyncEngine, event: str, topic: str
) -> dict[str, float]:
    codes = await insert_coupons(engine, event, N)
    hot = await insert_hot_coupon(engine, event, "hot-user")
    port = localrun.free_port()
    proc = subprocess.Popen(  # noqa: ASYNC220 - returns at once
        [sys.executable, "-m", "flashcoupon_wallet", "--port", str(port)],
        env={
            **env,
            "FLASHCOUPON_MYSQL_URL": mysql_url,
            "FLASHCOUPON_WALLET_REDEEMED_TOPIC": topic,
            "FLASHCOUPON_WALLET_LOG_LEVEL": "WARNING",
        },
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await asyncio.to_thread(localrun.wait_ready, f"{url}/readyz", timeout=60, proc=proc)
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
    return result


def main() -> None:
    result = asyncio.run(main_async())
    body = {"benchmark": "wallet", "at": datetime.now(UTC).isoformat(timespec="seconds"), **result}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench-wallet.json").write_text(json.dumps(body, indent=2) + "\n")
    print("wallet bench:", orjson.dumps(result).decode())


if __name__ == "__main__":
    main()
