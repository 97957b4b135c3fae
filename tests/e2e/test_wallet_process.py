"""`flashcoupon-wallet` as a process, the way it is deployed: starts, serves, stops on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import orjson
from flashcoupon_common.messages import CouponRedeemed
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import Stack, random_name
from tests.integration.test_wallet_api import (
    USER,
    add_coupon,
    add_event,
    consume_all,
    free_port,
)
from tests.support.env import LOCAL


async def wait_ready(url: str, proc: subprocess.Popen[Any], wait_s: float = 30) -> None:
    deadline = time.monotonic() + wait_s
    async with httpx.AsyncClient() as c:
        for _ in range(int(wait_s * 10)):
            assert proc.poll() is None, "wallet exited during start-up"
            try:
                if (await c.get(url + "/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    raise AssertionError("wallet did not become ready")


def start_wallet(
    stack: Stack, mysql_url: str, topic: str, *, output: int = subprocess.PIPE, **env: str
) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m flashcoupon_wallet` on a free port, against this database and
    topic (`env` adds or overrides variables); returns the process and its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "flashcoupon_wallet", "--port", str(port)],
        env={
            **stack.env(),
            "FLASHCOUPON_MYSQL_URL": mysql_url,
            "FLASHCOUPON_WALLET_REDEEMED_TOPIC": topic,
            **env,
        },
        stdout=output,
        stderr=output,
    )
    return proc, f"http://127.0.0.1:{port}"


async def test_wallet_process_serves_and_stops_cleanly(
    stack: Stack, mysql_url: str, mysql_engine: AsyncEngine, kafka_topic: str
) -> None:
    event = random_name("ev")
    await add_event(mysql_engine, event)
    code = await add_coupon(mysql_engine, event, "alice")
    proc, url = start_wallet(stack, mysql_url, kafka_topic)
    try:
        await wait_ready(url, proc)
        async with httpx.AsyncClient(base_url=url) as c:
            r = await c.post(
                f"/v1/coupons/{code}/redeem",
                json={"orderId": "o-1", "orderAmount": 25_000},
                headers={USER: "alice"},
            )
            assert r.status_code == 200 and r.json()["payAmount"] == 15_000
            r = await c.get("/v1/me/coupons", headers={USER: "alice"})
            assert [x["status"] for x in r.json()["coupons"]] == ["redeemed"]
        proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.to_thread(proc.communicate, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # uvicorn re-raises SIGTERM after its graceful shutdown, hence -15 rather than 0
    assert proc.returncode in (0, -signal.SIGTERM), err.decode()[-2000:]
    logs = [orjson.loads(line) for line in out.splitlines() if line.strip()]
    assert any(x["msg"].startswith("wallet listening") for x in logs)
    assert any(x["msg"] == "wallet stopped" for x in logs)  # the lifespan shutdown ran
    assert all(x["service"] == "wallet" for x in logs)
    events = [CouponRedeemed.decode(v) for v in await consume_all(stack, kafka_topic, want=1)]
    assert [(e.code, e.order_id) for e in events] == [(code, "o-1")]


def test_bad_configuration_fails_start_up_naming_the_variable() -> None:
    def start(env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "flashcoupon_wallet"],
            env={**env, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            timeout=60,
            check=False,
        )

    bad = start({**LOCAL, "FLASHCOUPON_WALLET_PORT": "eighty"})
    assert bad.returncode != 0
    assert b"FLASHCOUPON_WALLET_PORT must be an integer" in bad.stderr
    # Outside the local stack a missing connection setting stops start-up, in one line.
    missing = start({})
    assert missing.returncode != 0
    assert missing.stderr.strip().splitlines() == [
        b"flashcoupon-wallet: FLASHCOUPON_MYSQL_URL is required but not set"
        b" (or set FLASHCOUPON_ENV=local for the local stack)"
    ]
