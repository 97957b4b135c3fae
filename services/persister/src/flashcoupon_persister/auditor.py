"""Redis ↔ MySQL drift, per event: what Redis says was issued against what MySQL holds.

Invariant 4 of the design: after the pipeline drains, MySQL rows = Redis issued records, one for
one. Records are matched by their allowance slot (user, seq) — the UNIQUE key the persister
writes by — and then compared by code and tier:

- missing:    issued in Redis, no row in MySQL (lost or still in flight in the pipeline);
- extra:      a row in MySQL that Redis does not hold (Redis lost a write, e.g. a failover);
- mismatched: the same slot with a different code or tier.

The comparison is a plain class fed one side at a time, so it is unit-tested without servers
and holds only the MySQL side in memory (slot → code, tier) while the Redis side streams past.
Repair re-publishes missing records to `coupon-issued` — the normal pipeline — and never
writes MySQL itself: the persister's idempotent writes make a record that was only in flight
harmless.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer
from flashcoupon_common import event_state
from flashcoupon_common.db.schema import user_coupons
from flashcoupon_common.messages import CouponIssued
from redis.asyncio.cluster import RedisCluster
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

Slot = tuple[str, int]  # (user id, seq) within one event


@dataclass(frozen=True, slots=True)
class MysqlCoupon:
    """The columns of a user_coupons row the audit compares."""

    event_id: str
    user_id: str
    seq: int
    code: str
    tier: str

    def to_json(self) -> dict[str, Any]:
        return {"userId": self.user_id, "seq": self.seq, "code": self.code, "tier": self.tier}


@dataclass(frozen=True, slots=True)
class Mismatch:
    user_id: str
    seq: int
    redis_code: str
    redis_tier: str
    mysql_code: str
    mysql_tier: str

    def to_json(self) -> dict[str, Any]:
        return {
            "userId": self.user_id,
            "seq": self.seq,
            "redis": {"code": self.redis_code, "tier": self.redis_tier},
            "mysql": {"code": self.mysql_code, "tier": self.mysql_tier},
        }


def _issued_json(r: CouponIssued) -> dict[str, Any]:
    return {"userId": r.user_id, "seq": r.seq, "code": r.code, "tier": r.tier}


@dataclass
class AuditReport:
    event_id: str
    redis_count: int = 0
    mysql_count: int = 0
    missing: list[CouponIssued] = field(default_factory=list)  # all of them: repair needs them
    extra: list[MysqlCoupon] = field(default_factory=list)
    mismatched: list[Mismatch] = field(default_factory=list)
    # issued in Redis after the cutoff and not (yet) in MySQL: in flight, not drift
    in_flight: int = 0
    republished: int | None = None  # set by --repair

    @property
    def clean(self) -> bool:
        return not (self.missing or self.extra or self.mismatched)

    def to_json(self, examples: int) -> dict[str, Any]:
        return {
            "eventId": self.event_id,
            "clean": self.clean,
            "redis": self.redis_count,
            "mysql": self.mysql_count,
            "missing": len(self.missing),
            "extra": len(self.extra),
            "mismatched": len(self.mismatched),
            "inFlight": self.in_flight,
            "republished": self.republished,
            "examples": {
                "missing": [_issued_json(r) for r in self.missing[:examples]],
                "extra": [r.to_json() for r in self.extra[:examples]],
                "mismatched": [m.to_json() for m in self.mismatched[:examples]],
            },
        }


class Comparison:
    """Feed every MySQL row first, then stream the Redis records; then `report()`.

    `cutoff_ms`: Redis records issued at or after it that MySQL lacks count as in flight
    (the audit read MySQL before they could have been persisted), not as missing.
    """

    def __init__(self, event_id: str, *, cutoff_ms: int | None = None) -> None:
        self._report = AuditReport(event_id)
        self._cutoff_ms = cutoff_ms
        self._mysql: dict[Slot, tuple[str, str]] = {}
        self._seen_redis = False

    def add_mysql(self, row: MysqlCoupon) -> None:
        if self._seen_redis:
            raise RuntimeError("feed every MySQL row before the Redis records")
        # tier names repeat on every row: interned, they cost one string per tier, not per row
        self._mysql[(row.user_id, row.seq)] = (row.code, sys.intern(row.tier))
        self._report.mysql_count += 1

    def add_redis(self, rec: CouponIssued) -> None:
        self._seen_redis = True
        report = self._report
        report.redis_count += 1
        held = self._mysql.pop((rec.user_id, rec.seq), None)
        if held is None:
            if self._cutoff_ms is not None and rec.issued_at_ms >= self._cutoff_ms:
                report.in_flight += 1
            else:
                report.missing.append(rec)
        elif held != (rec.code, rec.tier):
            report.mismatched.append(
                Mismatch(rec.user_id, rec.seq, rec.code, rec.tier, held[0], held[1])
            )

    def report(self) -> AuditReport:
        report = self._report
        report.extra = [
            MysqlCoupon(report.event_id, user, seq, code, tier)
            for (user, seq), (code, tier) in sorted(self._mysql.items())
        ]
        # Stable order, so examples and test expectations do not depend on hash-scan order.
        report.missing.sort(key=lambda r: (r.user_id, r.seq))
        report.mismatched.sort(key=lambda m: (m.user_id, m.seq))
        return report


def compare(
    redis_records: Iterable[CouponIssued],
    mysql_rows: Iterable[MysqlCoupon],
    *,
    event_id: str = "",
    cutoff_ms: int | None = None,
) -> AuditReport:
    cmp = Comparison(event_id, cutoff_ms=cutoff_ms)
    for row in mysql_rows:
        cmp.add_mysql(row)
    for rec in redis_records:
        cmp.add_redis(rec)
    return cmp.report()


# ---- I/O edges


async def mysql_coupons(engine: AsyncEngine, event_id: str) -> AsyncIterator[MysqlCoupon]:
    """Stream an event's rows (server-side cursor), so a 10 M-row event is not one result set."""
    uc = user_coupons
    query = (
        select(uc.c.user_id, uc.c.seq, uc.c.code, uc.c.tier)
        .where(uc.c.event_id == event_id)
        .execution_options(yield_per=5000)
    )
    async with engine.connect() as conn:
        result = await conn.stream(query)
        async for user_id, seq, code, tier in result:
            yield MysqlCoupon(event_id, user_id, int(seq), code, tier)


async def audit_event(
    redis: RedisCluster, engine: AsyncEngine, event_id: str, *, settle_seconds: float = 0
) -> AuditReport:
    """Compare one event. Records issued after the audit started (minus settle_seconds) and
    absent from MySQL are in flight rather than missing."""
    cutoff_ms = int((time.time() - settle_seconds) * 1000)
    cmp = Comparison(event_id, cutoff_ms=cutoff_ms)
    async for row in mysql_coupons(engine, event_id):
        cmp.add_mysql(row)
    async for rec in event_state.iter_issued(redis, event_id):
        cmp.add_redis(rec)
    return cmp.report()


async def republish(producer: AIOKafkaProducer, topic: str, records: list[CouponIssued]) -> int:
    """Send missing records down the normal pipeline; returns how many Kafka acknowledged."""
    futures = [await producer.send(topic, r.encode(), key=r.kafka_key()) for r in records]
    await asyncio.gather(*futures)
    return len(futures)
