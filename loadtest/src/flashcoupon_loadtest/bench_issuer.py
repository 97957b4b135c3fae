"""`make bench-issuer`: the issuer against the HTTP framework's own ceiling, same run, same box.

    uv run python -m flashcoupon_loadtest.bench_issuer [--requests 30000] [--rounds 2]

Five paths, each served by ONE uvicorn worker process started with the services' own options
(flashcoupon_loadtest.serve: uvloop, the guarded httptools protocol, no access log):

  hello    a hello-world Starlette route (flashcoupon_loadtest.hello), GET /
  naive    the issuer app with FLASHCOUPON_ISSUER_BATCHING=false: one EVALSHA round trip per
           request through redis-py's RedisCluster
  issuer   the real issuer app: auto-pipelined EVALSHA (redis_batch), on an event large enough
           never to sell out during the run
  floor    the issuer's floor (flashcoupon_loadtest.issuer_floor): the same batcher and issue.lua
           behind nothing but reading two headers and a JSON answer; issuer/floor is what the
           issuer's own rules cost, floor/hello what one HTTP request per press allows here
  soldout  the same issuer process on a sold-out event: answered from the local flag

The load comes from the project's driver (flashcoupon_loadtest.driver, raw keep-alive
HTTP/1.1) in its own process; every request is a distinct shopper with its own
Idempotency-Key. Rounds alternate the paths so machine noise hits all of them; the best round
of each path is reported (a ceiling measurement), all rounds are kept in the JSON. Results go
to loadtest/results/bench-issuer.json. Targets: issuer >= 60 % of hello, sold-out >= 85 %.
"box ceiling" is each path's ratio had it run at the rate the two cores allow at the CPU per
request its server, Redis master and driver measured (rounds.ceiling_rps), hello as measured.
For naive, issuer and floor it also reports the CPU per request of the Redis master running
the event's issue.lua: one script run per press (naive) against the batcher's merged runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from flashcoupon_common import event_state, keys
from flashcoupon_common.lua import ISSUE
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import RedisSettings

from flashcoupon_loadtest import driver
from flashcoupon_loadtest.benchkit import (
    RESULTS,
    bench_spec,
    event_master,
    report_head,
    run_rounds,
    serve,
    stop_all,
)
from flashcoupon_loadtest.localrun import free_port, stack_env
from flashcoupon_loadtest.rounds import DEFAULT_ROUNDS, share_cell

TARGETS = {"issuer": 0.60, "soldout": 0.85}
PATHS = ("hello", "naive", "issuer", "floor", "soldout")
ISSUING = ("naive", "issuer", "floor")  # the paths whose presses run issue.lua
FLOOR_APP = "flashcoupon_loadtest.issuer_floor:app"


async def _provision(
    redis_settings: RedisSettings, run: str
) -> tuple[dict[str, str], dict[str, int]]:
    """The paths' events, and per path the pid of the Redis master that runs its event's
    issue.lua (INFO's process_id)."""
    client = create_redis_cluster(redis_settings)
    await client.initialize()
    events = {
        "naive": f"bench-naive-{run}",
        "issuer": f"bench-live-{run}",
        "floor": f"bench-floor-{run}",
    }
    for eid in events.values():
        await event_state.provision(client, bench_spec(eid, 10_000_000))
    sold = f"bench-sold-{run}"
    await event_state.provision(client, bench_spec(sold, 1))
    await client.eval(ISSUE.source, 5, *keys.issue_keys(sold), "first", "r-first", "", "", "")
    events["soldout"] = sold
    masters = {}
    for path, eid in events.items():
        _, masters[path] = await event_master(client, eid)
    await client.aclose()
    return events, masters


async def _cleanup(redis_settings: RedisSettings, events: dict[str, str]) -> None:
    client = create_redis_cluster(redis_settings)
    await client.initialize()
    for eid in events.values():
        await event_state.delete_state(client, eid)
    await client.aclose()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_issuer")
    ap.add_argument("--requests", type=int, default=30_000, help="requests per path per round")
    ap.add_argument("--concurrency", type=int, default=128, help="keep-alive connections")
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    ap.add_argument("--processes", type=int, default=driver.default_processes())
    ap.add_argument("--out", default=str(RESULTS / "bench-issuer.json"))
    args = ap.parse_args(argv)

    env = stack_env()
    redis_settings = RedisSettings.from_env(env)
    run = f"{int(time.time())}"
    events, masters = asyncio.run(_provision(redis_settings, run))
    ports = {name: free_port() for name in PATHS if name != "soldout"}  # soldout: the issuer
    procs = {
        "hello": serve(
            "flashcoupon_loadtest.hello:app", ports["hello"], env, "bench-hello.log", False
        ),
        "naive": serve(
            "flashcoupon_issuer.__main__:build",
            ports["naive"],
            {**env, "FLASHCOUPON_ISSUER_BATCHING": "false"},
            "bench-naive.log",
            True,
            service="issuer",
        ),
        "issuer": serve(
            "flashcoupon_issuer.__main__:build",
            ports["issuer"],
            env,
            "bench-issuer.log",
            True,
            service="issuer",
        ),
        "floor": serve(FLOOR_APP, ports["floor"], env, "bench-floor.log", False, service="issuer"),
    }
    targets = {
        path: (
            f"http://127.0.0.1:{ports['issuer' if path == 'soldout' else path]}",
            procs["issuer" if path == "soldout" else path].pid,
            None if path == "hello" else events[path],
        )
        for path in PATHS
    }
    try:
        rounds = run_rounds(
            targets,
            requests=args.requests,
            rounds=args.rounds,
            concurrency=args.concurrency,
            processes=args.processes,
            watch={path: {"redis": masters[path]} for path in ISSUING},
        )
    finally:
        stop_all(procs.values())
        asyncio.run(_cleanup(redis_settings, events))

    best = {path: max(ms, key=lambda m: m["rps"]) for path, ms in rounds.items()}
    hello = best["hello"]["rps"]
    ratios = {path: round(best[path]["rps"] / hello, 3) for path in PATHS[1:]}
    # The same comparison by server CPU per request (median over rounds): hello's cost / path's.
    cpu = {
        path: statistics.median(m["server_cpu_us_per_request"] for m in ms)
        for path, ms in rounds.items()
    }
    cpu_ratios = {path: round(cpu["hello"] / cpu[path], 3) for path in PATHS[1:]}
    # The event's Redis master per issue: one script run per request (naive) against the
    # batcher's, which runs the presses of one event queued together as one script call.
    redis_cpu = {
        path: statistics.median(m["cpu_us_per_request"]["redis"] for m in rounds[path])
        for path in ISSUING
    }
    # Each path at its box ceiling (the rate the two cores allow at the CPU per request its
    # server, Redis master and driver measured) against hello as measured: the most any overlap
    # of the path's processes could give; a target above it needs less CPU per request.
    ceilings = {
        path: statistics.median(m["ceiling_rps"] for m in ms) for path, ms in rounds.items()
    }
    ceiling_ratios = {path: round(ceilings[path] / hello, 3) for path in ceilings}
    report = {
        **report_head("issuer", args),
        "best": best,
        "rounds": rounds,
        "ratios_vs_hello": ratios,
        "server_cpu_us_per_request": cpu,
        "cpu_ratios_vs_hello": cpu_ratios,
        "redis_master_cpu_us_per_request": redis_cpu,
        "ceiling_rps": ceilings,
        "ceiling_ratios_vs_hello": ceiling_ratios,
        "targets": TARGETS,
        "met": {k: ratios[k] >= v for k, v in TARGETS.items()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print()
    print(
        f"{'path':8s} {'req/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'vs hello':>9s}"
        f" {'cpu us/req':>11s} {'cpu vs hello':>13s} {'box ceiling':>12s} {'busy':>5s}"
    )
    for path in PATHS:
        b = best[path]
        ratio = 1.0 if path == "hello" else ratios[path]
        cr = 1.0 if path == "hello" else cpu_ratios[path]
        print(
            f"{path:8s} {b['rps']:9.0f} {b['p50_ms']:8.2f} {b['p99_ms']:8.2f} {ratio:9.2f}"
            f" {cpu[path]:11.1f} {cr:13.2f} {ceiling_ratios[path]:12.2f}"
            f" {share_cell(b.get('box_busy')):>5s}"
        )
    print(
        f"event's Redis master CPU per issue: naive {redis_cpu['naive']:.1f} us,"
        f" issuer {redis_cpu['issuer']:.1f} us (issuer/naive"
        f" {redis_cpu['issuer'] / max(redis_cpu['naive'], 0.1):.2f}),"
        f" floor {redis_cpu['floor']:.1f} us"
    )
    print(
        f"issuer/floor {best['issuer']['rps'] / best['floor']['rps']:.2f} req/s,"
        f" {cpu['floor'] / cpu['issuer']:.2f} by server CPU (what the issuer's own rules cost);"
        f" floor/hello {ratios['floor']:.2f} (what one HTTP request per press allows here)"
    )
    print(f"targets: {TARGETS}; met: {report['met']}; written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
