"""`flashcoupon-auditor`: compare Redis and MySQL per event; optionally re-publish what is missing.

Exit status: 0 when every audited event is clean, 1 when drift was found (also after a
repair: the repair goes through the pipeline, so re-run the audit once it drained), 2 when
the audit could not run (bad arguments, an event with no runtime state, a server unreachable).
Connection settings come from FLASHCOUPON_REDIS_NODES, FLASHCOUPON_KAFKA_BOOTSTRAP and
FLASHCOUPON_MYSQL_URL (defaults: the local stack).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from typing import Any

import orjson
from aiokafka.errors import KafkaError
from flashcoupon_common import event_state, keys, topics, validation
from flashcoupon_common.db.engine import create_engine
from flashcoupon_common.kafka_producer import ProducerHolder, idempotent_producer_factory
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import KafkaSettings, MysqlSettings, RedisSettings, SettingsError
from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError

from flashcoupon_persister.auditor import AuditReport, audit_event, republish

logger = logging.getLogger(__name__)

CLEAN, DRIFT, FAILED = 0, 1, 2


class AuditFailed(Exception):
    """The audit could not run; the message says why."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="flashcoupon-auditor",
        description="Compare issued coupons in Redis with rows in MySQL, per event.",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--event", action="append", metavar="ID", help="event id (repeatable)")
    which.add_argument("--all", action="store_true", help="every event registered in Redis")
    p.add_argument(
        "--repair",
        action="store_true",
        help="re-publish records missing from MySQL to Kafka (the persister writes them)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--examples", type=int, default=5, metavar="N", help="examples per kind")
    p.add_argument(
        "--settle-seconds",
        type=float,
        default=0.0,
        metavar="S",
        help="treat records issued in the last S seconds as in flight, not missing",
    )
    p.add_argument("--topic", default=topics.COUPON_ISSUED, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.examples < 0 or args.settle_seconds < 0:
        p.error("--examples and --settle-seconds must not be negative")
    for event_id in args.event or ():
        if not validation.EVENT_ID.ok(event_id):
            p.error(f"--event {event_id!r} is not a valid event id (DNS-1123 label)")
    return args


async def run(args: argparse.Namespace) -> list[AuditReport]:
    redis = create_redis_cluster(RedisSettings.from_env())
    engine = create_engine(MysqlSettings.from_env(), pool_size=2)
    # Kafka is needed (and its settings read) only for a repair.
    producer: ProducerHolder | None = None
    try:
        if args.all:
            members = await redis.smembers(keys.EVENTS_REGISTRY)
            event_ids = sorted(m.decode() if isinstance(m, bytes) else m for m in members)
        else:
            event_ids = list(dict.fromkeys(args.event))
        reports = []
        for event_id in event_ids:
            if await event_state.read_state(redis, event_id) is None:
                if args.all:
                    # registered but without state: deleted (or half-provisioned) meanwhile
                    logger.warning("skipping %s: no runtime state in Redis", event_id)
                    continue
                raise AuditFailed(f"event {event_id} has no runtime state in Redis")
            report = await audit_event(redis, engine, event_id, settle_seconds=args.settle_seconds)
            if args.repair and report.missing:
                if producer is None:
                    bootstrap = KafkaSettings.from_env().bootstrap
                    producer = ProducerHolder(idempotent_producer_factory(bootstrap))
                started, _ = await producer.get()
                report.republished = await republish(started, args.topic, report.missing)
            elif args.repair:
                report.republished = 0
            reports.append(report)
        return reports
    finally:
        if producer is not None:
            await producer.close()
        await engine.dispose()
        await redis.aclose()


def render_text(reports: list[AuditReport], examples: int) -> str:
    lines = []
    for r in reports:
        state = "clean" if r.clean else "DRIFT"
        lines.append(
            f"event {r.event_id}: {state}  redis={r.redis_count} mysql={r.mysql_count} "
            f"missing={len(r.missing)} extra={len(r.extra)} mismatched={len(r.mismatched)} "
            f"in_flight={r.in_flight}"
        )
        for rec in r.missing[:examples]:
            lines.append(f"  missing    user={rec.user_id} seq={rec.seq} code={rec.code}")
        for row in r.extra[:examples]:
            lines.append(f"  extra      user={row.user_id} seq={row.seq} code={row.code}")
        for m in r.mismatched[:examples]:
            lines.append(
                f"  mismatched user={m.user_id} seq={m.seq} "
                f"redis={m.redis_code}/{m.redis_tier} mysql={m.mysql_code}/{m.mysql_tier}"
            )
        if r.republished is not None:
            lines.append(f"  republished {r.republished} missing record(s) to Kafka")
    if not reports:
        lines.append("no events to audit")
    return "\n".join(lines) + "\n"


def render_json(reports: list[AuditReport], examples: int) -> str:
    body: dict[str, Any] = {
        "clean": all(r.clean for r in reports),
        "events": [r.to_json(examples) for r in reports],
    }
    return orjson.dumps(body, option=orjson.OPT_INDENT_2).decode() + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        reports = asyncio.run(run(args))
    except (AuditFailed, SettingsError) as exc:
        sys.stderr.write(f"flashcoupon-auditor: {exc}\n")
        sys.exit(FAILED)
    except (OSError, RedisError, KafkaError, DBAPIError) as exc:
        sys.stderr.write(f"flashcoupon-auditor: cannot reach a server: {exc!r}\n")
        sys.exit(FAILED)
    render = render_json if args.json else render_text
    sys.stdout.write(render(reports, args.examples))
    sys.exit(CLEAN if all(r.clean for r in reports) else DRIFT)


if __name__ == "__main__":
    main()
