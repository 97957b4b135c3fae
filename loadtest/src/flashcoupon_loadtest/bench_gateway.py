"""`make bench-gateway`: the issuer called directly vs through the gateway, same run, same machine.

    uv run python -m flashcoupon_loadtest.bench_gateway [--users 20000] [--rounds 2]

Both sides get the same number of service processes (`--processes`, default 1): issuer-direct
runs P issuer workers; through-gateway runs P gateway workers in front of the same P issuer
workers. The gateway does everything it does in production — HS256 JWT verification (every
shopper a new token), per-IP and per-user GCRA checks in Redis Cluster, the event admission
lookup — with limits set so they do not bind. Each round is a closed-loop burst of distinct
shoppers (one press each) against a fresh event; rounds alternate direct/gateway so machine
noise hits both. Writes loadtest/results/bench-gateway.json; the target is a throughput ratio
(gateway / direct) of at least 0.45.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from flashcoupon_common import event_state
from flashcoupon_common.event_spec import AdmissionSpec, EventSpec, TierSpec
from flashcoupon_common.messages import Discount
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import RedisSettings

from flashcoupon_loadtest import driver
from flashcoupon_loadtest.localrun import free_port, stack_env, wait_ready
from flashcoupon_loadtest.scenarios import Burst
from flashcoupon_loadtest.stats import latency_summary, outcome_counts, throughput
from flashcoupon_loadtest.tokens import DEMO_SECRET

RESULTS = Path(__file__).resolve().parents[2] / "results"
TARGET_RATIO = 0.45


def _start(script: str, port: int, workers: int, env: dict[str, str], log: Path) -> Any:
    exe = Path(sys.executable).parent / script
    out = log.open("wb")
    proc = subprocess.Popen(
        [str(exe), "--port", str(port), "--workers", str(workers)],
        env={**os.environ, **env},
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    wait_ready(f"http://127.0.0.1:{port}/readyz", proc=proc, timeout=60)
    return proc


def _stop(proc: Any) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _provision(quantity: int, tag: str) -> str:
    redis = create_redis_cluster(RedisSettings.from_env())
    try:
        now = datetime.now(UTC)
        spec = EventSpec(
            event_id=f"bench-gw-{tag}-{os.urandom(4).hex()}",
            title="bench-gateway",
            quantity=quantity,
            start_at=now - timedelta(seconds=5),
            end_at=now + timedelta(hours=1),
            tiers=(TierSpec("all", Discount("fixed", amount=1000), 100),),
            # Limits that do not bind: the bench measures their cost, not their effect.
            admission=AdmissionSpec(per_user_per_second=100, per_user_burst=100),
        )
        await event_state.provision(redis, spec)
        return spec.event_id
    finally:
        await redis.aclose()


def _cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU time (user + system) each service process has used so far (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, pid in pids.items():
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out[name] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _round(
    mode: str, url: str, users: int, concurrency: int, drivers: int, pids: dict[str, int]
) -> dict[str, Any]:
    event_id = asyncio.run(_provision(users, mode))
    scenario = Burst(
        event_id=event_id,
        mode=mode,  # type: ignore[arg-type]
        users=users,
        concurrency=concurrency,
        dup_fraction=0.0,
        retry_fraction=0.0,
        user_prefix=f"b{os.urandom(3).hex()}-",
        name=f"bench-gateway-{mode}",
    )
    cpu0 = _cpu_seconds(pids)
    result = driver.run(scenario, [url], processes=drivers)
    cpu1 = _cpu_seconds(pids)
    records = result.records
    return {
        "mode": mode,
        "requests": len(records),
        "rps": round(throughput(records), 1),
        # Service CPU per request: what each hop costs, independent of machine contention.
        "cpu_us_per_request": {
            name: round((cpu1[name] - cpu0[name]) / max(1, len(records)) * 1e6, 1) for name in pids
        },
        "latency_ms": {
            k: round(v, 2) for k, v in latency_summary(r.latency for r in records).items()
        },
        "outcomes": outcome_counts(records),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_gateway", description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=20_000, help="shoppers per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per side, alternating")
    parser.add_argument("--concurrency", type=int, default=64, help="driver connections")
    parser.add_argument("--processes", type=int, default=1, help="service processes per side")
    parser.add_argument("--drivers", type=int, default=driver.default_processes())
    args = parser.parse_args(argv)

    RESULTS.mkdir(parents=True, exist_ok=True)
    logs = RESULTS.parent.parent / ".stack" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = stack_env()
    issuer_port, gateway_port = free_port(), free_port()
    issuer = _start(
        "flashcoupon-issuer", issuer_port, args.processes, env, logs / "bench-gw-issuer.log"
    )
    gateway = None
    try:
        gateway = _start(
            "flashcoupon-gateway",
            gateway_port,
            args.processes,
            {
                **env,
                "FLASHCOUPON_GATEWAY_JWT_SECRET": DEMO_SECRET,
                "FLASHCOUPON_GATEWAY_ISSUER_URLS": f"http://127.0.0.1:{issuer_port}",
                "FLASHCOUPON_GATEWAY_IP_PER_SECOND": "1000000",
                "FLASHCOUPON_GATEWAY_IP_BURST": "1000000",
            },
            logs / "bench-gw-gateway.log",
        )
        targets = {
            "issuer": f"http://127.0.0.1:{issuer_port}",
            "gateway": f"http://127.0.0.1:{gateway_port}",
        }
        pids = {"issuer": issuer.pid, "gateway": gateway.pid}
        # Warm-up (connections, script caches, token cache-cold but import-warm), not reported.
        for mode in ("issuer", "gateway"):
            _round(mode, targets[mode], 2000, args.concurrency, args.drivers, pids)
        rounds = []
        for i in range(args.rounds):
            for mode in ("issuer", "gateway") if i % 2 == 0 else ("gateway", "issuer"):
                r = _round(mode, targets[mode], args.users, args.concurrency, args.drivers, pids)
                print(f"[bench-gateway] round {i + 1} {mode}: {r['rps']} req/s "
                      f"p50 {r['latency_ms']['p50']} ms p99 {r['latency_ms']['p99']} ms "
                      f"{r['outcomes']} cpu us/req {r['cpu_us_per_request']}",
                      flush=True)  # fmt: skip
                rounds.append(r)
    finally:
        if gateway is not None:
            _stop(gateway)
        _stop(issuer)

    def side(mode: str) -> dict[str, Any]:
        mine = [r for r in rounds if r["mode"] == mode]
        return {
            "rps": round(statistics.median(r["rps"] for r in mine), 1),
            "cpu_us_per_request": {
                name: round(statistics.median(r["cpu_us_per_request"][name] for r in mine), 1)
                for name in ("issuer", "gateway")
            },
            "p50_ms": round(statistics.median(r["latency_ms"]["p50"] for r in mine), 2),
            "p99_ms": round(statistics.median(r["latency_ms"]["p99"] for r in mine), 2),
        }

    direct, through = side("issuer"), side("gateway")
    ratio = through["rps"] / direct["rps"] if direct["rps"] else 0.0
    report = {
        "benchmark": "gateway",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)},
        "config": vars(args),
        "issuer_direct": direct,
        "through_gateway": through,
        "throughput_ratio": round(ratio, 3),
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO,
        "rounds": rounds,
    }
    out = RESULTS / "bench-gateway.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"[bench-gateway] issuer direct {direct['rps']} req/s (p50 {direct['p50_ms']} ms, "
        f"p99 {direct['p99_ms']} ms); through gateway {through['rps']} req/s "
        f"(p50 {through['p50_ms']} ms, p99 {through['p99_ms']} ms); "
        f"ratio {ratio:.2f} (target >= {TARGET_RATIO}); service CPU per request: direct "
        f"{direct['cpu_us_per_request']['issuer']} us, through gateway "
        f"{through['cpu_us_per_request']} us -> {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
