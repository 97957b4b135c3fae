"""`make bench-gateway`: the gateway against the issuer direct and a hello-world, same run.

    uv run python -m flashcoupon_loadtest.bench_gateway [--users 20000] [--rounds 2]
        [--paths hello,issuer,gateway,floor,crowd,soldout,unbatched] [--scheduling batch|default]

Paths (each round a closed-loop burst of distinct shoppers, one press each, every shopper its
own HS256 JWT in the gateway paths; rounds alternate the order so machine noise hits all):

  hello      the same requests (JWT, Idempotency-Key, body) to a hello-world process on the
             services' server options (flashcoupon_loadtest.serve): the denominator (one
             process, whatever --processes says)
  issuer     the issuer called directly (X-Flashcoupon-User), on a fresh event
  gateway    through the gateway to that issuer: a forwarded issue, on a fresh event
  floor      as `gateway`, through the gateway's floor (flashcoupon_loadtest.gateway_floor): the
             gateway's own batcher and pool to the same issuer, behind nothing but reading the
             token's `sub` unverified; gateway/floor is what the gateway's rules cost,
             floor/issuer-direct what one more HTTP hop allows here (this tree only)
  crowd      as `gateway`, but each shopper from its own address (X-Forwarded-For, which the
             bench's gateway trusts, one hop): a drop's traffic, as `make demo` sends it, where
             the per-IP limit is one more script call per press (from one address the IP's
             tokens are leased, ~one call per 100 ms)
  soldout    through the gateway, at an event sold out before the round (quantity 1, sold by
             a few presses through the same gateway): the gateway's own 410 SOLD_OUT
  unbatched  forwarded issues through a second gateway started with
             FLASHCOUPON_GATEWAY_ISSUE_BATCH_MAX=0 (the press batcher off; a revision whose
             settings lack the variable ignores it, and this path equals `gateway`)

The gateway and issuer run from the workspace's console scripts (their own `main()`, the way
they are deployed), `--processes` workers each; limits are set so they do not bind (the bench
measures their cost, not their effect). Each round reports req/s and the CPU per request of
every service process (/proc utime + stime) and of the Redis master owning the round's event
("event master": its issue.lua runs, and the limiter keys that hash there). Ratios:
gateway/issuer, soldout/hello, issuer/hello, unbatched/gateway, crowd/gateway, gateway/floor,
floor/issuer. Writes
loadtest/results/bench-gateway.json. `--scheduling` as `make demo` (localrun.batch_scheduling):
SCHED_BATCH for every process the bench starts (the default), or `default`, the OS's policy,
which earlier figures were taken under. bench_revisions runs these paths for two revisions in
one run (`start_services`, `run_paths`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from flashcoupon_common import event_state
from flashcoupon_common.event_spec import AdmissionSpec
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import RedisSettings

from flashcoupon_loadtest import driver
from flashcoupon_loadtest.benchkit import (
    HELLO_APP,
    LOGS,
    bench_spec,
    event_master,
    measure,
    publish,
    serve,
    stop_all,
)
from flashcoupon_loadtest.localrun import (
    add_scheduling_option,
    apply_scheduling,
    free_port,
    stack_env,
    wait_ready,
)
from flashcoupon_loadtest.rounds import (
    DEFAULT_ROUNDS,
    Ratio,
    round_orders,
)
from flashcoupon_loadtest.scenarios import Burst
from flashcoupon_loadtest.tokens import DEMO_SECRET

Kind = Literal["hello", "issuer", "gateway", "floor", "crowd", "soldout"]
PATHS = ("hello", "issuer", "gateway", "floor", "crowd", "soldout", "unbatched")
# Issue 13: forwarded issue >= 0.60 of issuer-direct, sold-out >= 0.70 of hello, issuer >= 0.60.
RATIOS = {
    "gateway/issuer-direct": Ratio("gateway", "issuer", 0.60),
    "soldout/hello": Ratio("soldout", "hello", 0.70),
    "issuer/hello": Ratio("issuer", "hello", 0.60),
    "gateway/hello": Ratio("gateway", "hello"),
    "crowd/gateway": Ratio("crowd", "gateway"),
    "unbatched/gateway": Ratio("unbatched", "gateway"),
    "gateway/floor": Ratio("gateway", "floor"),
    "floor/issuer-direct": Ratio("floor", "issuer"),
}
FLOOR_APP = "flashcoupon_loadtest.gateway_floor:app"
UNBATCHED_ENV = {"FLASHCOUPON_GATEWAY_ISSUE_BATCH_MAX": "0"}
# The Redis master owning the round's event (its issue.lua, and whatever limiter keys hash
# there): reported with the services' CPU per request.
EVENT_MASTER = "event master"


@dataclass(frozen=True)
class Started:
    """A service process this bench started, and where it listens."""

    proc: subprocess.Popen[bytes]
    url: str


@dataclass(frozen=True)
class PathSpec:
    """One measured path: what it sends, to which server, whose CPU it reports."""

    kind: Kind
    url: str
    pid: int  # the process the path measures (its CPU is `cpu_us_per_request[process]`)
    process: str
    watch: Mapping[str, int] = field(default_factory=dict)  # every process whose CPU to read


def start_services(
    bin_dir: Path,
    *,
    processes: int,
    env: Mapping[str, str],
    tag: str,
    unbatched: bool,
    floor: bool = False,
) -> dict[str, Started]:
    """An issuer and a gateway (and the unbatched gateway) from `bin_dir`'s console scripts;
    with `floor`, the gateway's floor too, from this tree, configured as the gateway.

    On failure everything started so far is stopped.
    """
    procs: dict[str, Started] = {}
    try:
        issuer_port = free_port()
        procs["issuer"] = _start(bin_dir, "flashcoupon-issuer", issuer_port, processes, env, tag)
        gateway_env = {
            **env,
            "FLASHCOUPON_GATEWAY_JWT_SECRET": DEMO_SECRET,
            "FLASHCOUPON_GATEWAY_ISSUER_URLS": f"http://127.0.0.1:{issuer_port}",
            "FLASHCOUPON_GATEWAY_IP_PER_SECOND": "1000000",
            "FLASHCOUPON_GATEWAY_IP_BURST": "1000000",
            # the crowd path's X-Forwarded-For; the other paths send none (the peer counts)
            "FLASHCOUPON_GATEWAY_TRUSTED_PROXIES": "1",
        }
        procs["gateway"] = _start(
            bin_dir, "flashcoupon-gateway", free_port(), processes, gateway_env, tag
        )
        if unbatched:
            procs["unbatched"] = _start(
                bin_dir,
                "flashcoupon-gateway",
                free_port(),
                processes,
                {**gateway_env, **UNBATCHED_ENV},
                f"{tag}-unbatched",
            )
        if floor:
            port = free_port()
            log = f"bench-gw-{tag}-floor.log"
            proc = serve(FLOOR_APP, port, {**env, **gateway_env}, log, False, service="gateway")
            procs["floor"] = Started(proc, f"http://127.0.0.1:{port}")
    except BaseException:
        stop_all(p.proc for p in procs.values())
        raise
    return procs


def _start(
    bin_dir: Path, script: str, port: int, workers: int, env: Mapping[str, str], tag: str
) -> Started:
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"bench-gw-{tag}-{script.removeprefix('flashcoupon-')}.log"
    with log.open("wb") as out:  # the child has its own descriptor
        proc = subprocess.Popen(
            [str(bin_dir / script), "--port", str(port), "--workers", str(workers)],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    wait_ready(f"{url}/readyz", proc=proc, timeout=60)
    return Started(proc, url)


def service_paths(procs: Mapping[str, Started], prefix: str = "") -> dict[str, PathSpec]:
    """The issuer, gateway, soldout (and unbatched, floor) paths of one set of service processes."""
    watch = {name: p.proc.pid for name, p in procs.items()}
    url = {name: p.url for name, p in procs.items()}
    paths = {
        f"{prefix}issuer": PathSpec("issuer", url["issuer"], watch["issuer"], "issuer", watch),
        f"{prefix}gateway": PathSpec("gateway", url["gateway"], watch["gateway"], "gateway", watch),
        f"{prefix}crowd": PathSpec("crowd", url["gateway"], watch["gateway"], "gateway", watch),
        f"{prefix}soldout": PathSpec("soldout", url["gateway"], watch["gateway"], "gateway", watch),
    }
    if "unbatched" in procs:
        paths[f"{prefix}unbatched"] = PathSpec(
            "gateway", url["unbatched"], watch["unbatched"], "unbatched", watch
        )
    if "floor" in procs:
        paths[f"{prefix}floor"] = PathSpec("floor", url["floor"], watch["floor"], "floor", watch)
    return paths


async def _provision(quantity: int, tag: str) -> tuple[str, int]:
    """A fresh event, and the pid of the Redis master that owns its slot (runs its issue.lua)."""
    redis = create_redis_cluster(RedisSettings.from_env(stack_env()))
    try:
        # Limits that do not bind: the bench measures their cost, not their effect.
        admission = AdmissionSpec(per_user_per_second=100, per_user_burst=100)
        spec = bench_spec(f"bench-gw-{tag}-{os.urandom(4).hex()}", quantity, admission)
        await event_state.provision(redis, spec)
        await redis.initialize()
        _, pid = await event_master(redis, spec.event_id)
        return spec.event_id, pid
    finally:
        await redis.aclose()


async def delete_events(event_ids: Sequence[str]) -> None:
    """The state of the events a benchmark provisioned, gone from Redis."""
    redis = create_redis_cluster(RedisSettings.from_env(stack_env()))
    try:
        for event_id in event_ids:
            await event_state.delete_state(redis, event_id)
    finally:
        await redis.aclose()


def _burst(kind: Kind, event_id: str, users: int, concurrency: int, prefix: str) -> Burst:
    return Burst(
        event_id=event_id,
        mode="issuer" if kind == "issuer" else "gateway",
        forwarded_for=kind == "crowd",
        users=users,
        concurrency=concurrency,
        dup_fraction=0.0,
        retry_fraction=0.0,
        user_prefix=prefix,
        name=f"bench-gateway-{kind}",
    )


def measure_path(
    spec: PathSpec, *, users: int, concurrency: int, drivers: int, events: list[str]
) -> dict[str, Any]:
    """One round of one path (its event provisioned first; its id appended to `events`)."""
    prefix = f"b{os.urandom(3).hex()}-"
    watch = dict(spec.watch)
    if spec.kind == "hello":
        event_id = "hello"
    else:
        quantity = 1 if spec.kind == "soldout" else 2 * users  # never sells out mid-round
        event_id, master = asyncio.run(_provision(quantity, spec.kind))
        events.append(event_id)
        watch[EVENT_MASTER] = master
    if spec.kind == "soldout":
        # Sold out through this very gateway, as a crowd would: it learns it before the round.
        sell = _burst("gateway", event_id, 50, 8, f"{prefix}sell-")
        driver.run(sell, [spec.url], processes=1)
    scenario = _burst(spec.kind, event_id, users, concurrency, prefix)
    m = measure(scenario, spec.url, drivers, spec.pid, watch)
    return {"kind": spec.kind, "process": spec.process, **m}


def run_paths(
    paths: Mapping[str, PathSpec],
    *,
    users: int,
    rounds: int,
    concurrency: int,
    drivers: int,
    tag: str = "bench-gateway",
) -> dict[str, list[dict[str, Any]]]:
    """A discarded warm-up round of every path, then `rounds` alternating rounds; the events
    they provisioned are deleted afterwards."""
    kept: dict[str, list[dict[str, Any]]] = {name: [] for name in paths}
    events: list[str] = []
    try:
        for spec in paths.values():  # warm-up: connections, script caches, imports
            measure_path(
                spec, users=min(users, 2000), concurrency=concurrency, drivers=drivers,
                events=events,
            )  # fmt: skip
        for i, order in enumerate(round_orders(list(paths), rounds)):
            for name in order:
                spec = paths[name]
                m = measure_path(
                    spec, users=users, concurrency=concurrency, drivers=drivers, events=events
                )
                kept[name].append(m)
                print(
                    f"[{tag}] round {i + 1} {name:<20} {m['rps']:>9,.0f} req/s  p50 "
                    f"{m['p50_ms']:6.2f} ms  p99 {m['p99_ms']:7.2f} ms  max/p50 "
                    f"{m['max_ms'] / max(m['p50_ms'], 1e-3):4.1f}x  {spec.process} CPU "
                    f"{m['cpu_us_per_request'].get(spec.process, m['server_cpu_us_per_request'])}"
                    f" us/req  {m['outcomes']}",
                    flush=True,
                )
    finally:
        asyncio.run(delete_events(events))
    return kept


def start_hello(tag: str) -> Started:
    """The hello-world baseline on the services' server options (flashcoupon_loadtest.serve)."""
    port = free_port()
    proc = serve(HELLO_APP, port, {}, f"bench-gw-{tag}-hello.log", False)
    return Started(proc, f"http://127.0.0.1:{port}")


def hello_path(hello: Started) -> PathSpec:
    pid = hello.proc.pid
    return PathSpec("hello", hello.url, pid, "hello", {"hello": pid})


def chosen_paths(parser: argparse.ArgumentParser, value: str, known: Sequence[str]) -> list[str]:
    """The comma-separated paths in `value`, each one of `known`; else the usage error."""
    chosen = [p for p in value.split(",") if p]
    unknown = set(chosen) - set(known)
    if unknown:
        parser.error(f"unknown paths {sorted(unknown)}; choose from {','.join(known)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_gateway", description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=20_000, help="shoppers per round")
    parser.add_argument(
        "--rounds", type=int, default=DEFAULT_ROUNDS, help="rounds per path, alternating"
    )
    parser.add_argument("--concurrency", type=int, default=64, help="driver connections")
    parser.add_argument("--processes", type=int, default=1, help="service processes per side")
    parser.add_argument("--drivers", type=int, default=driver.default_processes())
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset")
    add_scheduling_option(parser)
    args = parser.parse_args(argv)
    chosen = chosen_paths(parser, args.paths, PATHS)

    apply_scheduling(args.scheduling)
    env = stack_env()
    bin_dir = Path(sys.executable).parent
    procs = start_services(
        bin_dir,
        processes=args.processes,
        env=env,
        tag="this",
        unbatched="unbatched" in chosen,
        floor="floor" in chosen,
    )
    try:
        available = service_paths(procs)
        procs["hello"] = start_hello("this")
        available["hello"] = hello_path(procs["hello"])
        paths = {name: available[name] for name in chosen}
        rounds = run_paths(
            paths,
            users=args.users,
            rounds=args.rounds,
            concurrency=args.concurrency,
            drivers=args.drivers,
        )
    finally:
        stop_all(p.proc for p in procs.values())

    publish(
        "gateway",
        args,
        rounds,
        RATIOS,
        {name: paths[name].process for name in paths},
        # The figure earlier reports named so (docs/gateway.md): gateway / issuer-direct.
        named={"throughput_ratio": "gateway/issuer-direct"},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
