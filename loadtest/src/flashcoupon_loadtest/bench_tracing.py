"""`make bench-tracing`: what tracing costs the issuer, off and on, against hello-world.

    uv run python -m flashcoupon_loadtest.bench_tracing [--requests 20000] [--rounds 2]

Three servers, one uvicorn worker each, started the same way as bench_issuer's (benchkit):

  hello    a hello-world Starlette route, the framework's own ceiling on this box
  off      the issuer with no OTEL_* variables: tracing off, the default
  on       the issuer with OTEL_TRACES_EXPORTER=otlp exporting to the local Jaeger
           (scripts/tracing.sh up; make bench-tracing starts it): every request is a root
           trace (the driver sends no traceparent) with two spans, all sampled — the worst case
  sampled  the same with OTEL_TRACES_SAMPLER=parentbased_traceidratio, 1 % of requests kept:
           what a production drop would run

Rounds alternate the paths; the best round of each is reported and all are kept. Ratios:
off/hello and on/hello by req/s; on/off and sampled/off by req/s and by the server's CPU per
request (steadier on a shared box). The span export (protobuf encoding, an HTTP POST per batch)
runs on a thread of the traced process, so its CPU is counted in the issuer's.
Results: loadtest/results/bench-tracing.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from flashcoupon_common import event_state
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import RedisSettings

from flashcoupon_loadtest import driver, jaeger
from flashcoupon_loadtest.benchkit import (
    RESULTS,
    bench_spec,
    report_head,
    run_rounds,
    serve,
    stop_all,
)
from flashcoupon_loadtest.localrun import free_port, stack_env
from flashcoupon_loadtest.rounds import DEFAULT_ROUNDS

PATHS = ("hello", "off", "on", "sampled")


async def _events(redis_settings: RedisSettings, run: str, delete: bool = False) -> dict[str, str]:
    events = {p: f"bench-tr{p}-{run}" for p in PATHS[1:]}
    client = create_redis_cluster(redis_settings)
    await client.initialize()
    for eid in events.values():
        if delete:
            await event_state.delete_state(client, eid)
        else:
            await event_state.provision(client, bench_spec(eid, 10_000_000))
    await client.aclose()
    return events


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_tracing")
    ap.add_argument("--requests", type=int, default=20_000, help="requests per path per round")
    ap.add_argument("--concurrency", type=int, default=128, help="keep-alive connections")
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    ap.add_argument("--processes", type=int, default=driver.default_processes())
    ap.add_argument("--out", default=str(RESULTS / "bench-tracing.json"))
    args = ap.parse_args(argv)

    if not jaeger.running():
        jaeger.up()
    env = stack_env()
    redis_settings = RedisSettings.from_env(env)
    run = f"{int(time.time())}"
    events = asyncio.run(_events(redis_settings, run))
    ports = {p: free_port() for p in PATHS}
    issuer = "flashcoupon_issuer.__main__:build"
    traced = {**env, **jaeger.otel_env(delay_ms=1000), "OTEL_SERVICE_NAME": "bench-issuer"}
    sampled = {
        **traced,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.01",
    }
    procs = {
        "hello": serve(
            "flashcoupon_loadtest.hello:app", ports["hello"], env, "bench-hello.log", False
        ),
        "off": serve(issuer, ports["off"], env, "bench-tracing-off.log", True, service="issuer"),
        "on": serve(issuer, ports["on"], traced, "bench-tracing-on.log", True, service="issuer"),
        "sampled": serve(
            issuer, ports["sampled"], sampled, "bench-tracing-sampled.log", True, service="issuer"
        ),
    }
    targets = {p: (f"http://127.0.0.1:{ports[p]}", procs[p].pid, events.get(p)) for p in PATHS}
    try:
        rounds = run_rounds(
            targets,
            requests=args.requests,
            rounds=args.rounds,
            concurrency=args.concurrency,
            processes=args.processes,
        )
    finally:
        stop_all(procs.values())
        asyncio.run(_events(redis_settings, run, delete=True))

    best = {p: max(ms, key=lambda m: m["rps"]) for p, ms in rounds.items()}
    cpu = {
        p: statistics.median(m["server_cpu_us_per_request"] for m in ms) for p, ms in rounds.items()
    }
    ratios = {
        "off_vs_hello": round(best["off"]["rps"] / best["hello"]["rps"], 3),
        "on_vs_hello": round(best["on"]["rps"] / best["hello"]["rps"], 3),
        "on_vs_off": round(best["on"]["rps"] / best["off"]["rps"], 3),
        "cpu_off_vs_on": round(cpu["off"] / cpu["on"], 3),
        "sampled_vs_off": round(best["sampled"]["rps"] / best["off"]["rps"], 3),
        "cpu_off_vs_sampled": round(cpu["off"] / cpu["sampled"], 3),
    }
    report = {
        **report_head("tracing", args),
        "traced": "OTEL_TRACES_EXPORTER=otlp to the local Jaeger; on: every request sampled, "
        "sampled: parentbased_traceidratio 0.01",
        "best": best,
        "rounds": rounds,
        "server_cpu_us_per_request": cpu,
        "ratios": ratios,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print()
    print(f"{'path':8s} {'req/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'cpu us/req':>11s}")
    for p in PATHS:
        b = best[p]
        print(f"{p:8s} {b['rps']:9.0f} {b['p50_ms']:8.2f} {b['p99_ms']:8.2f} {cpu[p]:11.1f}")
    print(f"ratios: {ratios}; written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
