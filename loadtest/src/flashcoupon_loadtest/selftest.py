"""The driver's own ceiling, measured against a hello-world Starlette app on uvicorn.

    uv run python -m flashcoupon_loadtest.driver --selftest [--requests N] [--concurrency C]

In one run: the raw HTTP/1.1 driver with 1 and 2 worker processes, and httpx with a pooled
client (the alternative we did not pick), all against the same hello-world server. The
answer rate is capped by whichever side saturates first on a shared 2-core machine, so the
figure that says whether the driver is a bottleneck is its cost: requests per CPU-second of
the driver itself ("ceiling per core"). Results go to loadtest/results/driver_selftest.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import time
from pathlib import Path

from flashcoupon_loadtest import driver
from flashcoupon_loadtest.localrun import free_port, wait_ready
from flashcoupon_loadtest.scenarios import GetLoop
from flashcoupon_loadtest.serve import server_command
from flashcoupon_loadtest.stats import latency_summary

RESULTS = Path(__file__).resolve().parents[2] / "results"


def start_hello(port: int) -> subprocess.Popen[bytes]:
    """The hello-world target: same server settings as our services (flashcoupon_loadtest.serve)."""
    cmd = server_command("flashcoupon_loadtest.hello:app", port)
    return subprocess.Popen(cmd)


async def _httpx_run(url: str, total: int, concurrency: int) -> tuple[float, float, list[float]]:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    latencies: list[float] = []
    todo = iter(range(total))
    async with httpx.AsyncClient(limits=limits) as client:

        async def worker() -> None:
            for _ in todo:
                p0 = time.perf_counter()
                r = await client.get(url)
                r.raise_for_status()
                latencies.append(time.perf_counter() - p0)

        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0, time.process_time() - cpu0, latencies


def measure(requests: int, concurrency: int) -> dict[str, object]:
    port = free_port()
    server = start_hello(port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{url}/readyz", timeout=30)
        rows: dict[str, object] = {}
        for procs in (1, 2):
            res = driver.run(
                GetLoop(path="/", total=requests, concurrency=concurrency), [url], processes=procs
            )
            bad = sum(1 for r in res.records if r.status != 200)
            rows[f"raw_{procs}proc"] = {
                "requests": len(res.records),
                "errors": bad,
                "rps": len(res.records) / res.wall_seconds,
                "driver_cpu_s": res.cpu_seconds,
                "ceiling_rps_per_core": res.driver_ceiling_rps,
                "latency_ms": latency_summary(r.latency for r in res.records),
            }
        n = max(1000, requests // 20)  # httpx is slow; a sample says enough
        wall, cpu, lat = asyncio.run(_httpx_run(url + "/", n, concurrency))
        rows["httpx_1proc"] = {
            "requests": n,
            "rps": n / wall,
            "driver_cpu_s": cpu,
            "ceiling_rps_per_core": n / cpu if cpu else 0.0,
            "latency_ms": latency_summary(lat),
        }
        return rows
    finally:
        server.terminate()
        server.wait(timeout=10)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m flashcoupon_loadtest.driver")
    ap.add_argument("--selftest", action="store_true", help="measure the driver's ceiling")
    ap.add_argument("--requests", type=int, default=60_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--out", type=Path, default=RESULTS / "driver_selftest.json")
    args = ap.parse_args(argv)
    if not args.selftest:
        ap.error("only --selftest runs from the command line; the demo and bench use the API")
    rows = measure(args.requests, args.concurrency)
    print(
        f"driver self-test: {args.requests} GET / on a hello-world Starlette/uvicorn, "
        f"concurrency {args.concurrency}"
    )
    print(f"{'client':<14}{'answers/s':>12}{'driver CPU s':>14}{'req per CPU-s':>15}{'p99 ms':>9}")
    for name, row in rows.items():
        assert isinstance(row, dict)
        print(
            f"{name:<14}{row['rps']:>12,.0f}{row['driver_cpu_s']:>14.2f}"
            f"{row['ceiling_rps_per_core']:>15,.0f}{row['latency_ms']['p99']:>9.1f}"
        )
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"requests": args.requests, "concurrency": args.concurrency, "results": rows}, indent=2
        )
    )
    print(f"written {out}")
    return 0
