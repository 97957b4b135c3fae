"""`make demo`: a real coupon drop on the local stack, with the invariant report.

    uv run python -m flashcoupon_loadtest.demo [--users 100000] [--coupons 10000] ...

Starts the services as processes (two gateways, two issuers, a relay, a persister, a wallet),
applies k8s/examples/demo-drop.yaml with couponctl (fresh name, startAt a few seconds ahead,
waiting room off), fires the burst through the gateways at startAt — distinct shoppers with
JWTs, some pressing 2–3 times, some clients retrying with the same Idempotency-Key — waits
until MySQL holds every coupon Redis issued, then checks DESIGN.md's invariants against Redis
and MySQL directly. Prints the report, writes JSON and PNG under loadtest/results/, exits 1
if any invariant (or an Idempotency-Key replay) failed. A private Prometheus (flashcoupon_loadtest
.observe; --no-prometheus skips it) scrapes the services, and dashboard.png shows the Grafana
drop overview's panels drawn from its range queries.

With --target URL it drives a deployed ingress instead and starts nothing; the stores it
checks are the ones FLASHCOUPON_REDIS_NODES / FLASHCOUPON_MYSQL_URL point at.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from flashcoupon_common.db.engine import create_engine
from flashcoupon_common.kafka_admin import create_topics, delete_topics
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import KafkaSettings, MysqlSettings, RedisSettings

from flashcoupon_loadtest import driver, observe, prometheus
from flashcoupon_loadtest.benchkit import hello_baseline
from flashcoupon_loadtest.cpu_watch import CpuWatch, stack_pids
from flashcoupon_loadtest.demo_report import drop_report, progress_line, replay_check
from flashcoupon_loadtest.drop import (
    DEFAULT_MANIFEST,
    PipelineWatch,
    couponctl_apply,
    demo_manifest,
)
from flashcoupon_loadtest.invariants import check_event
from flashcoupon_loadtest.localrun import (
    ROOT,
    LocalServices,
    add_scheduling_option,
    apply_scheduling,
    stack_env,
)
from flashcoupon_loadtest.procstat import peak_rss_mib
from flashcoupon_loadtest.redis_calls import command_delta, read_commandstats
from flashcoupon_loadtest.report import format_report, plot, write_json
from flashcoupon_loadtest.scenarios import Burst
from flashcoupon_loadtest.stats import ISSUED
from flashcoupon_loadtest.tokens import DEFAULT_AUDIENCE, DEMO_SECRET

RESULTS = Path(__file__).resolve().parents[2] / "results"
DECISIONS = {ISSUED, "DUPLICATE", "SOLD_OUT"}  # answers the issuer decided (not 429/5xx/errors)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m flashcoupon_loadtest.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--users", type=int, default=100_000, help="distinct shoppers (100,000)")
    ap.add_argument("--coupons", type=int, default=10_000, help="the event's quantity (10,000)")
    ap.add_argument("--concurrency", type=int, default=128, help="open connections (128)")
    ap.add_argument(
        "--duration",
        type=float,
        default=0.0,
        help="spread first presses over this many seconds (0: as fast as possible)",
    )
    ap.add_argument("--processes", type=int, default=1, help="driver worker processes (1)")
    ap.add_argument("--gateways", type=int, default=2, help="gateway processes started (2)")
    ap.add_argument("--issuers", type=int, default=2, help="issuer processes started (2)")
    ap.add_argument(
        "--baseline-requests",
        type=int,
        default=30_000,
        help="before the drop, this many presses (same driver, concurrency, processes and "
        "request shape) to a hello-world process on the services' server options: the report's "
        "denominator (30,000; 0 skips; never with --target)",
    )
    ap.add_argument(
        "--target",
        action="append",
        default=[],
        help="gateway/ingress URL to drive; repeatable; then no local services",
    )
    ap.add_argument(
        "--jwt-secret", default=os.environ.get("FLASHCOUPON_GATEWAY_JWT_SECRET", DEMO_SECRET)
    )
    ap.add_argument("--jwt-audience", default=DEFAULT_AUDIENCE)
    ap.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST)
    ap.add_argument("--event", help="event name (default demo-HHMMSS-random; must be new)")
    ap.add_argument("--lead", type=float, default=4.0, help="seconds from apply to startAt")
    ap.add_argument("--dup-fraction", type=float, default=0.10)
    ap.add_argument("--retry-fraction", type=float, default=0.05)
    ap.add_argument("--drain-timeout", type=float, default=180.0)
    ap.add_argument("--keep-services", action="store_true", help="leave services running")
    ap.add_argument(
        "--cleanup",
        action="store_true",
        help="delete the event's Redis state afterwards (MySQL rows stay)",
    )
    ap.add_argument("--results-dir", type=Path, default=RESULTS)
    ap.add_argument(
        "--prometheus",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="scrape the local services with a private Prometheus and draw the drop overview "
        "dashboard into dashboard.png (default on; skipped when Prometheus cannot be installed)",
    )
    ap.add_argument("--mysql-url", help="check this database (default FLASHCOUPON_MYSQL_URL)")
    add_scheduling_option(ap)
    args = ap.parse_args(argv)
    if args.gateways < 1 or args.issuers < 1:
        ap.error("--gateways and --issuers must each be at least 1")
    return args


async def run(args: argparse.Namespace) -> int:
    t_begin = time.time()
    stamp = datetime.now(UTC).strftime("%H%M%S")
    event_id = args.event or f"demo-{stamp}-{secrets.token_hex(3)}"
    env = {**os.environ, **stack_env()}
    if args.mysql_url:
        env["FLASHCOUPON_MYSQL_URL"] = args.mysql_url
    topic = f"{event_id}-issued"
    kafka = KafkaSettings.from_env(env)
    redis = create_redis_cluster(RedisSettings.from_env(env))
    engine = create_engine(MysqlSettings.from_env(env), pool_size=2)
    services: LocalServices | None = None
    prom: prometheus.Prometheus | None = None
    try:
        if not args.target:
            await create_topics(kafka.bootstrap, topic, partitions=6)
            services = LocalServices(
                gateways=args.gateways,
                issuers=args.issuers,
                jwt_secret=args.jwt_secret,
                env={"FLASHCOUPON_MYSQL_URL": env["FLASHCOUPON_MYSQL_URL"]},
                per_service_env={
                    "relay": {
                        "FLASHCOUPON_RELAY_EVENTS": event_id,
                        "FLASHCOUPON_RELAY_TOPIC": topic,
                    },
                    "persister": {
                        "FLASHCOUPON_PERSISTER_TOPIC": topic,
                        "FLASHCOUPON_PERSISTER_GROUP_ID": f"{event_id}-persister",
                    },
                },
            )
            prom = prometheus.scrape_local(services) if args.prometheus else None
            print(f"starting services (logs in {services.log_dir}) ...", flush=True)
            t0 = time.time()
            try:
                await asyncio.to_thread(services.start)
            except asyncio.CancelledError:
                services.stop()  # also makes the starting thread give up waiting
                raise
            print(
                f"  {len(services.services)} services ready in {time.time() - t0:.1f}s: "
                + ", ".join(f"{s.name} :{s.port}" for s in services.services)
            )
        targets = args.target or (services.gateway_urls if services else [])
        hello = None
        if args.baseline_requests > 0 and not args.target:
            hello = await asyncio.to_thread(_hello_baseline, args)
        start_at = datetime.now(UTC) + timedelta(seconds=args.lead)
        doc = demo_manifest(args.manifest, name=event_id, quantity=args.coupons, start_at=start_at)
        when = start_at.strftime("%H:%M:%S.%f")[:-3]
        print(f"couponctl apply -f {args.manifest.name} as {event_id}, startAt {when} UTC")
        print(
            "  " + couponctl_apply(doc, args.results_dir / "manifests", env).replace("\n", "\n  ")
        )
        draw = None
        if prom is not None:
            draw = functools.partial(_draw_dashboard, prom, args, event_id, start_at)
        pids = {s.name: s.proc.pid for s in services.services if s.proc} if services else {}
        return await _drop(
            args, event_id, start_at, targets, redis, engine, t_begin, draw, hello, pids
        )
    finally:
        if prom is not None:
            prom.stop()
        if services is not None and not args.keep_services:
            await asyncio.to_thread(services.stop)
        if services is not None and args.keep_services:
            print("services left running: " + ", ".join(s.url for s in services.services))
        if not args.target and not args.keep_services:
            await delete_topics(kafka.bootstrap, topic)
        await redis.aclose()
        await engine.dispose()


async def _drop(
    args: argparse.Namespace,
    event_id: str,
    start_at: datetime,
    targets: list[str],
    redis: Any,
    engine: Any,
    t_begin: float,
    draw_dashboard: Callable[[], None] | None = None,
    hello: dict[str, Any] | None = None,
    pids: dict[str, int] | None = None,
) -> int:
    burst = Burst(
        event_id=event_id,
        users=args.users,
        concurrency=args.concurrency,
        jwt_secret=args.jwt_secret,
        jwt_audience=args.jwt_audience,
        dup_fraction=args.dup_fraction,
        retry_fraction=args.retry_fraction,
        pace_seconds=args.duration,
        forwarded_for=True,
    )
    watch = PipelineWatch(redis, engine, event_id)
    watch.start()
    print(
        f"burst: {args.users:,} shoppers, concurrency {args.concurrency}, "
        f"{args.processes} driver process(es) -> {', '.join(targets)}"
    )
    # A 50 ms margin: a press that reaches Redis before startAt is (rightly) NOT_STARTED.
    stop = threading.Event()
    pids = pids or {}
    stack_dir = Path(os.environ.get("FLASHCOUPON_STACK_DIR") or ROOT / ".stack")
    cpu = CpuWatch(pids, stack_pids(stack_dir)).start()
    redis_before = await read_commandstats(redis)
    try:
        result = await asyncio.to_thread(
            driver.run,
            burst,
            targets,
            processes=args.processes,
            start_at=start_at.timestamp() + 0.05,
            progress=progress_line(watch, args.coupons),
            stop=stop,
        )
    except asyncio.CancelledError:
        stop.set()  # Ctrl-C: the thread would otherwise finish the whole burst first
        raise
    finally:
        cpu.stop()
    redis_calls = command_delta(redis_before, await read_commandstats(redis))
    if sys.stdout.isatty():
        print()
    records = result.records
    await watch.stop()
    print(
        f"waiting for the pipeline to drain (MySQL rows = Redis issued, "
        f"up to {args.drain_timeout:.0f}s) ...",
        flush=True,
    )
    drained_at = await watch.wait_drained(args.drain_timeout)
    _, redis_issued, persisted = watch.last
    answers = [(r.user, r.coupon) for r in records if r.code == ISSUED]
    demand = len({r.user for r in records if r.code in DECISIONS})
    checks = await check_event(redis, engine, event_id, demand=demand, answers=answers)
    checks.append(replay_check(records))
    peak_rss = peak_rss_mib(pids) if pids else None  # while the services still run
    if draw_dashboard is not None:
        # Before the cleanup: deleting the event makes the services drop its series.
        await asyncio.to_thread(draw_dashboard)
    if args.cleanup:
        from flashcoupon_common.event_state import delete_state

        await delete_state(redis, event_id)
    report = drop_report(
        args,
        event_id=event_id,
        t_begin=t_begin,
        targets=targets,
        records=records,
        driver_cpu_seconds=result.cpu_seconds,
        samples=watch.samples,
        drained=drained_at is not None,
        redis_issued=redis_issued,
        persisted=persisted,
        checks=checks,
        hello=hello,
        peak_rss=peak_rss,
        cpu_samples=cpu.samples,
        services=list(pids),
        redis_calls=redis_calls,
    )
    print(format_report(report, checks))
    args.results_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = args.results_dir / "demo.json", args.results_dir / "demo.png"
    write_json(json_path, report)
    plot(
        png_path,
        records,
        watch.samples,
        go_at=result.go_at,
        title=f"{event_id}: {args.users:,} shoppers, {args.coupons:,} coupons",
    )
    print(f"report {json_path}\nplot   {png_path}")
    return 0 if report["passed"] else 1


def _hello_baseline(args: argparse.Namespace) -> dict[str, Any]:
    """The drop's presses, minus duplicates and replays, to one hello-world process."""
    scenario = Burst(
        event_id="hello-baseline",
        users=args.baseline_requests,
        concurrency=args.concurrency,
        jwt_secret=args.jwt_secret,
        jwt_audience=args.jwt_audience,
        dup_fraction=0.0,
        retry_fraction=0.0,
        forwarded_for=True,
        user_prefix="hello-",
        name="hello-baseline",
    )
    print(
        f"baseline: {args.baseline_requests:,} presses to a hello-world process, concurrency "
        f"{args.concurrency}, {args.processes} driver process(es) ...",
        flush=True,
    )
    m = hello_baseline(scenario, processes=args.processes)
    print(f"  hello-world {m['rps']:,.0f} answers/s, p99 {m['p99_ms']:.1f} ms {m['outcomes']}")
    return m


def _draw_dashboard(
    prom: prometheus.Prometheus, args: argparse.Namespace, event_id: str, start_at: datetime
) -> None:
    time.sleep(2)  # the last scrapes after the drain
    png = args.results_dir / "dashboard.png"
    title = f"{event_id}: {args.users:,} shoppers, {args.coupons:,} coupons"
    drawn = observe.render_drop_overview(
        prom, png, start=start_at.timestamp() - 5, end=time.time(), event_id=event_id,
        subtitle=title,
    )  # fmt: skip
    print(f"dashboard {png} (drop overview from Prometheus, {drawn} panels with data)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    apply_scheduling(args.scheduling)  # the driver and every service it starts
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        print("\ninterrupted; services stopped")
        return 130


if __name__ == "__main__":
    sys.exit(main())
