"""`couponctl`: drive CouponEvents from a shell, without Kubernetes (docs/couponctl.md).

Exit codes: 0 done; 1 not found or a server could not be reached; 2 invalid input (manifest,
arguments, settings); 3 a spec change was refused (nothing changed).

couponctl has no timers, so `apply` preloads Redis at once rather than at startAt - warmup;
the issue script opens and closes the window itself from Redis server time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from flashcoupon_common.db.engine import create_engine
from flashcoupon_common.event_spec import EventSpec
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import MysqlSettings, RedisSettings, SettingsError
from flashcoupon_common.validation import DNS_LABEL
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from flashcoupon_operator import runtime
from flashcoupon_operator.fields import parse_duration
from flashcoupon_operator.manifest import FieldError, ManifestError, parse_manifests

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_REJECTED = 0, 1, 2, 3
PROGRESS_FROM = 10_000  # events at least this large get progress lines while preloading


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="couponctl", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("apply", "validate, write the catalog and preload Redis (idempotent)"),
        ("validate", "check a manifest offline; prints every error with its field path"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("-f", "--filename", required=True, help="CouponEvent YAML ('-' = stdin)")
        # For demos and local runs: the same file, a fresh name and a window starting soon.
        p.add_argument("--name", help="override metadata.name (a file with one event only)")
        p.add_argument(
            "--start-in",
            metavar="DURATION",
            help="override startAt to now + DURATION (e.g. 10s), keeping the window's length",
        )
    p = sub.add_parser("list", help="every live event: name, phase, quantity, issued, start")
    p.add_argument("--json", action="store_true", help="print one JSON array")
    p = sub.add_parser("status", help="phase, quantity, issued, remaining, persisted, window")
    p.add_argument("name")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p = sub.add_parser("delete", help="drop the Redis state; the catalog row is marked deleted")
    p.add_argument("name")
    p.add_argument(
        "--force", action="store_true", help="delete even if issued coupons are not in MySQL yet"
    )
    for name, text in (
        ("pause", "emergency stop: the issue script refuses until resumed"),
        ("resume", "undo pause"),
    ):
        sub.add_parser(name, help=text).add_argument("name")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    specs: list[EventSpec] | None = None
    if args.command in ("apply", "validate"):
        specs = _load(args.filename)
        if specs is None:
            return EXIT_INVALID
        try:
            specs = overrides(specs, name=args.name, start_in=args.start_in, now=runtime.utcnow())
        except ManifestError as exc:
            for error in exc.errors:
                print(f"couponctl: {error}", file=sys.stderr)
            return EXIT_INVALID
        if args.command == "validate":
            for s in specs:
                print(f"couponevent/{s.event_id} valid: {_summary(s)}")
            return EXIT_OK
    try:
        redis_settings, mysql_settings = RedisSettings.from_env(), MysqlSettings.from_env()
    except SettingsError as exc:
        print(f"couponctl: {exc}", file=sys.stderr)
        return EXIT_INVALID
    try:
        return asyncio.run(_run(args, redis_settings, mysql_settings, specs=specs))
    except (RedisError, RedisClusterException, SQLAlchemyError, OSError) as exc:
        # First line only: SQLAlchemy appends a "Background on this error" link.
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"couponctl: cannot complete {args.command}: {reason}", file=sys.stderr)
        return EXIT_FAILED


def _load(filename: str) -> list[EventSpec] | None:
    try:
        text = sys.stdin.read() if filename == "-" else Path(filename).read_text()
    except OSError as exc:
        print(f"couponctl: cannot read {filename}: {exc.strerror}", file=sys.stderr)
        return None
    try:
        return parse_manifests(text)
    except ManifestError as exc:
        print(f"{filename}: {len(exc.errors)} error(s):", file=sys.stderr)
        for error in exc.errors:
            print(f"  {error}", file=sys.stderr)
        return None


def overrides(
    specs: list[EventSpec], *, name: str | None, start_in: str | None, now: datetime
) -> list[EventSpec]:
    """Apply --name / --start-in; ManifestError names the option when it is unusable."""
    if name is not None:
        if len(specs) != 1:
            raise ManifestError([FieldError("--name", "needs a file with exactly one event")])
        if not DNS_LABEL.ok(name):
            raise ManifestError([FieldError("--name", f"{name!r} is not a DNS-1123 label")])
        specs = [replace(specs[0], event_id=name)]
    if start_in is not None:
        delay, problem = parse_duration(start_in, allow_zero=True)
        if delay is None:
            raise ManifestError([FieldError("--start-in", problem or "invalid")])
        start = now.replace(microsecond=0) + delay
        specs = [replace(s, start_at=start, end_at=start + (s.end_at - s.start_at)) for s in specs]
    return specs


def _summary(s: EventSpec) -> str:
    tiers = ", ".join(
        f"{t.name} {n:,}" for t, n in zip(s.tiers, s.tier_quantities().values(), strict=True)
    )
    return f"{s.quantity:,} coupons ({tiers}), {s.start_at.isoformat()} .. {s.end_at.isoformat()}"


async def _run(
    args: argparse.Namespace,
    redis_settings: RedisSettings,
    mysql_settings: MysqlSettings,
    *,
    specs: list[EventSpec] | None,
) -> int:
    redis = create_redis_cluster(redis_settings)
    engine = create_engine(mysql_settings, pool_size=2)
    try:
        if args.command == "apply":
            assert specs is not None
            codes = [await _apply(s, redis, engine) for s in specs]
            return max(codes)
        if args.command == "list":
            return await _list(args.json, redis, engine)
        if args.command == "status":
            return await _status(args.name, args.json, redis, engine)
        if args.command == "delete":
            try:
                had_state, marked = await runtime.delete(redis, engine, args.name, force=args.force)
            except runtime.NotPersisted as exc:
                print(
                    f"couponevent/{args.name} not deleted: {exc} (or --force, which loses them)",
                    file=sys.stderr,
                )
                return EXIT_REJECTED
            if not (had_state or marked):
                print(f"couponevent/{args.name}: nothing to delete", file=sys.stderr)
                return EXIT_FAILED
            print(f"couponevent/{args.name} deleted (Redis state removed, catalog row kept)")
            return EXIT_OK
        paused = args.command == "pause"
        try:
            await runtime.set_paused(redis, args.name, paused)
        except runtime.NotFound as exc:
            print(f"couponctl: {exc}", file=sys.stderr)
            return EXIT_FAILED
        print(f"couponevent/{args.name} {'paused' if paused else 'resumed'}")
        return EXIT_OK
    finally:
        await redis.aclose()
        await engine.dispose()


async def _apply(spec: EventSpec, redis: RedisCluster, engine: AsyncEngine) -> int:
    name = f"couponevent/{spec.event_id}"
    printer = _ProgressPrinter(spec.event_id) if spec.quantity >= PROGRESS_FROM else None
    try:
        plan = await runtime.apply(
            spec, redis=redis, engine=engine, preload_now=True, progress=printer
        )
    except runtime.Rejected as exc:
        print(f"{name} rejected: {exc.plan.rejection}", file=sys.stderr)
        return EXIT_REJECTED
    verb = "created" if plan.changes == ("new event",) else "configured"
    if not plan.changes:
        verb = "unchanged"
    print(f"{name} {verb}")
    for change in plan.changes if verb == "configured" else ():
        print(f"  {change}")
    st = await runtime.status(redis, engine, spec.event_id)
    print(f"  phase {st.phase}, quantity {st.quantity:,}, remaining {st.remaining:,}")
    return EXIT_OK


class _ProgressPrinter:
    """Prints `preloading NAME: 40% (4,000/10,000)` each time another 10 % is reached."""

    def __init__(self, event_id: str) -> None:
        self.event_id = event_id
        self.next_step = 0

    def __call__(self, done: int, total: int) -> None:
        pct = 100 if total <= 0 else done * 100 // total
        if pct < self.next_step:
            return
        print(f"preloading {self.event_id}: {pct}% ({done:,}/{total:,})", flush=True)
        self.next_step = (pct // 10 + 1) * 10


async def _list(as_json: bool, redis: RedisCluster, engine: AsyncEngine) -> int:
    events = await runtime.list_events(redis, engine)
    if as_json:
        print(json.dumps([e.to_json() for e in events]))
        return EXIT_OK
    row = "{:<40} {:<10} {:>10} {:>10} {:>10} {:>7}  {}"
    print(row.format("NAME", "PHASE", "QUANTITY", "ISSUED", "REMAINING", "PAUSED", "START"))
    for e in events:
        doc = e.to_json()
        print(
            row.format(
                e.event_id,
                doc["phase"],
                f"{e.quantity:,}",
                "-" if e.issued is None else f"{e.issued:,}",
                "-" if e.remaining is None else f"{e.remaining:,}",
                "yes" if e.paused else "no",
                doc["startAt"],
            )
        )
    return EXIT_OK


async def _status(name: str, as_json: bool, redis: RedisCluster, engine: AsyncEngine) -> int:
    try:
        st = await runtime.status(redis, engine, name)
    except runtime.NotFound as exc:
        print(f"couponctl: {exc}", file=sys.stderr)
        return EXIT_FAILED
    doc = st.to_json()
    if as_json:
        print(json.dumps(doc))
        return EXIT_OK

    def n(v: int | None) -> str:
        return "-" if v is None else f"{v:,}"

    print(f"couponevent/{name}")
    print(f"  phase      {doc['phase']}" + ("  (PAUSED)" if st.paused else ""))
    print(f"  quantity   {n(st.quantity)}")
    print(f"  issued     {n(st.issued)}")
    print(f"  remaining  {n(st.remaining)}")
    print(f"  persisted  {n(st.persisted)}")
    print(f"  window     {doc['startAt']} .. {doc['endAt']}")
    print(f"  paused     {'yes' if st.paused else 'no'}")
    for tier, quantity, issued in st.tiers:
        print(f"  tier       {tier}: {n(issued)} of {n(quantity)} issued")
    if st.deleted_at:
        print(f"  deleted    {doc['deletedAt']}")
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
