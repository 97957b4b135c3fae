"""What the single-server benchmarks share: start a server process (flashcoupon_loadtest.serve:
the services' own uvicorn options), measure one scenario against it (req/s, latency, the
server's CPU per request), a never-selling-out event and the Redis master that runs its
issue.lua, rounds that alternate the paths, the report's head.

bench_issuer, bench_master, bench_tracing, bench_servers and bench_gateway use it; the numbers
are comparable between them because the server, the driver and the measurement are the same
code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from flashcoupon_common import keys
from flashcoupon_common.event_spec import AdmissionSpec, EventSpec, TierSpec
from flashcoupon_common.messages import Discount
from redis.asyncio.cluster import ClusterNode, RedisCluster

from flashcoupon_loadtest import driver
from flashcoupon_loadtest.localrun import free_port, wait_ready
from flashcoupon_loadtest.procstat import cpu_seconds, peak_rss_mib
from flashcoupon_loadtest.rounds import (
    Ratio,
    ceiling_rps,
    ratio_lines,
    ratios,
    sides,
    table_lines,
)
from flashcoupon_loadtest.scenarios import Burst, GetLoop
from flashcoupon_loadtest.serve import Server, server_command
from flashcoupon_loadtest.stats import latency_summary, outcome_counts, throughput

RESULTS = Path(__file__).resolve().parents[2] / "results"
LOGS = Path(__file__).resolve().parents[3] / ".stack" / "logs"
HELLO_APP = "flashcoupon_loadtest.hello:app"


TWO_TIERS = (
    TierSpec("big", Discount("fixed", amount=10000), 10),
    TierSpec("small", Discount("percent", percent=5, max_amount=3000), 90),
)
ONE_TIER = (TierSpec("all", Discount("fixed", amount=10000), 100),)


def bench_spec(
    event_id: str,
    quantity: int,
    admission: AdmissionSpec | None = None,
    tiers: tuple[TierSpec, ...] = TWO_TIERS,
) -> EventSpec:
    """An event open now, with two tiers unless told; `admission` for limits other than the
    defaults."""
    now = datetime.now(UTC)
    return EventSpec(
        event_id=event_id,
        title="bench",
        quantity=quantity,
        start_at=now - timedelta(minutes=1),
        end_at=now + timedelta(hours=2),
        tiers=tiers,
        admission=admission or AdmissionSpec(),
    )


async def event_master(client: RedisCluster, event_id: str) -> tuple[ClusterNode, int]:
    """The Redis master owning `event_id`'s slot (where its issue.lua runs) and its pid, whose
    CPU a benchmark reads from /proc: it must run on this machine."""
    node = client.get_node_from_key(keys.config_key(event_id))
    assert node is not None, f"no Redis node owns {event_id}'s slot"
    return node, running_here(int((await node.execute_command("INFO", "server"))["process_id"]))


def running_here(pid: int) -> int:
    """`pid` when it runs on this machine; SystemExit otherwise."""
    if not Path(f"/proc/{pid}/stat").exists():
        raise SystemExit(f"the event's Redis master (pid {pid}) does not run on this machine")
    return pid


def serve(
    app: str,
    port: int,
    env: dict[str, str],
    log: str,
    factory: bool,
    *,
    server: Server = "uvicorn",
    service: str = "hello",
) -> Any:
    """Start `app` (1 worker) and wait for its /readyz; its output goes to .stack/logs/`log`."""
    LOGS.mkdir(parents=True, exist_ok=True)
    cmd = server_command(app, port, factory=factory, server=server, service=service)
    with (LOGS / log).open("wb") as out:  # the child has its own descriptor
        proc = subprocess.Popen(
            cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
        )
    wait_ready(f"http://127.0.0.1:{port}/readyz", proc=proc, timeout=60)
    return proc


def measure(
    scenario: Any,
    url: str,
    processes: int,
    server_pid: int,
    watch: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """`scenario` against `url`; `watch` names more processes whose CPU per request to report
    (the issuer behind a gateway, ...) in `cpu_us_per_request`. `ceiling_rps` is the rate this
    box could give at the CPU per request of the server, the watched processes and the driver
    (rounds.ceiling_rps). `box_busy` is the share of all cores busy while the driver fired and
    `other_cpu_us_per_request` the busy CPU per request no measured process (nor the driver) was
    charged with: a path far below its ceiling with the box busy spends CPU the ceiling leaves
    out (loopback traffic in the kernel, the Redis replica); with the box idle, it waits."""
    watched = dict(watch or {})
    pids = {server_pid, *watched.values()}  # the server may be watched under its name too
    before = {pid: cpu_seconds(pid) for pid in pids}
    result = driver.run(scenario, [url], processes=processes, timeout=300)
    used = {pid: cpu_seconds(pid) - before[pid] for pid in pids}
    busy, total = result.box_cpu_seconds or (0.0, 0.0)
    recs = result.records
    per_request = 1e6 / max(1, len(recs))
    other = busy - sum(used.values()) - result.cpu_seconds
    lat = latency_summary(r.latency for r in recs)
    return {
        "requests": len(recs),
        "rps": round(throughput(recs), 1),
        "p50_ms": round(lat["p50"], 2),
        "p99_ms": round(lat["p99"], 2),
        "max_ms": round(lat["max"], 2),
        "outcomes": outcome_counts(recs),
        "driver_cpu_s": round(result.cpu_seconds, 2),
        # CPU the one server process spent per answer: on a shared box this is steadier than
        # req/s, and its inverse is the process's ceiling if it had a core to itself.
        "server_cpu_us_per_request": round(used[server_pid] * per_request, 1),
        "cpu_us_per_request": {
            name: round(used[pid] * per_request, 1) for name, pid in watched.items()
        },
        "driver_cpu_us_per_request": round(result.cpu_seconds * per_request, 1),
        "ceiling_rps": ceiling_rps(
            (c * per_request for c in used.values()),
            result.cpu_seconds * per_request,
            cpus=os.cpu_count() or 1,
        ),
        "box_busy": round(busy / total, 3) if total > 0 else None,
        "other_cpu_us_per_request": round(max(0.0, other) * per_request, 1),
        "wall_s": round(result.wall_seconds, 2),
    }


def hello_baseline(scenario: Any, *, processes: int, server: Server = "uvicorn") -> dict[str, Any]:
    """`scenario` against one hello-world server process started for it (then stopped): the
    same-run denominator of a ratio. The hello app answers any path, so `scenario` can be the
    very requests the service under test gets; `measure`'s figures plus its peak memory."""
    port = free_port()
    proc = serve(HELLO_APP, port, {}, f"bench-hello-{server}.log", False, server=server)
    try:
        m = measure(scenario, f"http://127.0.0.1:{port}", processes, proc.pid)
        m["peak_rss_mib"] = peak_rss_mib({"hello": proc.pid})["hello"]
        return m
    finally:
        stop_all([proc])


def issue_or_hello(path: str, event_id: str | None, n: int, concurrency: int, prefix: str) -> Any:
    """The scenario of one round: GET / of hello-world, or a burst of distinct shoppers."""
    if event_id is None:
        return GetLoop(path="/", total=n, concurrency=concurrency)
    return Burst(
        event_id=event_id,
        mode="issuer",
        users=n,
        concurrency=concurrency,
        dup_fraction=0.0,
        retry_fraction=0.0,
        user_prefix=prefix,
        name=f"bench-{path}",
    )


def run_rounds(
    targets: Mapping[str, tuple[str, int, str | None]],
    *,
    requests: int,
    rounds: int,
    concurrency: int,
    processes: int,
    watch: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Alternate the paths (name -> (url, server pid, event id or None for hello)) for
    `rounds` rounds after a discarded warm-up round; every kept measurement per path.
    `watch` (path -> name -> pid): more processes whose CPU per request a path reports."""
    kept: dict[str, list[dict[str, Any]]] = {path: [] for path in targets}
    for rnd in range(rounds + 1):  # round 0 warms every path up and is discarded
        n = requests if rnd else max(2000, requests // 10)
        for path, (url, pid, event_id) in targets.items():
            scenario = issue_or_hello(path, event_id, n, concurrency, f"r{rnd}-{path}-")
            m = measure(scenario, url, processes, pid, (watch or {}).get(path))
            if rnd:
                kept[path].append(m)
                print(
                    f"round {rnd} {path:8s} {m['rps']:9.0f} req/s  p50 {m['p50_ms']:6.2f} ms"
                    f"  p99 {m['p99_ms']:6.2f} ms  server CPU "
                    f"{m['server_cpu_us_per_request']:6.1f} us/req  {m['outcomes']}",
                    flush=True,
                )
    return kept


def stop_all(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def report_head(name: str, args: Any) -> dict[str, Any]:
    """The fields every single-server benchmark report starts with."""
    return {
        "benchmark": name,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "settings": {
            "requests_per_round": args.requests,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "driver_processes": args.processes,
            "server": "1 uvicorn worker, the services' options (flashcoupon_loadtest.serve)",
        },
    }


def publish(
    benchmark: str,
    args: argparse.Namespace,
    rounds: Mapping[str, Any],
    wanted: Mapping[str, Ratio],
    processes: Mapping[str, str],
    *,
    heading: Iterable[str] = (),
    named: Mapping[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A same-run comparison's end, for bench_gateway, bench_servers and bench_revisions:
    each path's medians and the `wanted` ratios, written to loadtest/results/bench-<name>.json
    (`extra` fields too; `named` copies a ratio's value to a top-level field) and printed as
    the table. `processes` names the process whose CPU each path reports."""
    measured = sides(rounds)
    computed = ratios(measured, wanted)
    report: dict[str, Any] = {
        "benchmark": benchmark,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        **extra,
        "machine": {"cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)},
        "config": vars(args),
        "paths": measured,
        "ratios": computed,
        **{key: computed.get(ratio, {}).get("value") for key, ratio in (named or {}).items()},
        "rounds": rounds,
    }
    out = RESULTS / f"bench-{benchmark}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print()
    for line in heading:
        print(line)
    print("\n".join(table_lines(measured, processes)))
    print("ratios (req/s, medians of the rounds, same run):")
    print("\n".join(ratio_lines(computed)))
    print(f"written to {out}")
    return report
