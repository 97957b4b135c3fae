"""The MySQL catalog of events: `coupon_events` and `coupon_tiers` rows, written idempotently.

The catalog row must exist before the first coupon can be issued: `user_coupons.event_id` is a
foreign key to it, so a persister batch for an event without its row would fail. Reconcile
therefore writes the catalog before it preloads Redis.

Deleting an event only marks `deleted_at`; the coupons already issued stay in MySQL as history,
and the name is not reused while any of its coupons is in MySQL (reconcile refuses: new coupons
would collide with the old rows' UNIQUE (event_id, user_id, seq)).

MySQL DATETIME has no zone: every time is stored as naive UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime

from flashcoupon_common.db.schema import coupon_events, coupon_tiers, user_coupons
from flashcoupon_common.event_spec import EventSpec
from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects.mysql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from flashcoupon_operator.model import CatalogRow, TierRow


def to_db_time(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(tzinfo=None)


def from_db_time(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC)


async def upsert_event(engine: AsyncEngine, spec: EventSpec) -> None:
    """Insert or update the event row and its tier rows in one transaction (apply twice = once).

    Tiers no longer in the spec are removed; reconcile only allows that before anything was
    issued, so no `user_coupons` row refers to them.
    """
    values = {
        "title": spec.title,
        "quantity": spec.quantity,
        "per_user_limit": spec.per_user_limit,
        "start_at": to_db_time(spec.start_at),
        "end_at": to_db_time(spec.end_at),
        "valid_for_seconds": int(spec.valid_for.total_seconds()),
        "spec": spec.to_json().decode(),
    }
    event = insert(coupon_events).values(id=spec.event_id, **values)
    # deleted_at is cleared: reconcile re-applies a deleted name only when it had no coupons.
    event = event.on_duplicate_key_update(**values, updated_at=func.now(3), deleted_at=None)
    per_tier = spec.tier_quantities()
    async with engine.begin() as conn:
        await conn.execute(event)
        for tier in spec.tiers:
            d = tier.discount
            row = {
                "discount_type": d.type,
                "amount": d.amount,
                "percent": d.percent,
                "max_amount": d.max_amount,
                "share": tier.share,
                "quantity": per_tier[tier.name],
            }
            stmt = insert(coupon_tiers).values(event_id=spec.event_id, name=tier.name, **row)
            await conn.execute(stmt.on_duplicate_key_update(**row))
        await conn.execute(
            delete(coupon_tiers).where(
                coupon_tiers.c.event_id == spec.event_id,
                coupon_tiers.c.name.not_in([t.name for t in spec.tiers]),
            )
        )


async def read_event(engine: AsyncEngine, event_id: str) -> CatalogRow | None:
    query = select(
        coupon_events.c.quantity, coupon_events.c.spec, coupon_events.c.deleted_at
    ).where(coupon_events.c.id == event_id)
    async with engine.connect() as conn:
        row = (await conn.execute(query)).first()
    if row is None:
        return None
    return CatalogRow(
        event_id=event_id,
        quantity=row.quantity,
        spec=EventSpec.from_json(row.spec),
        deleted_at=None if row.deleted_at is None else from_db_time(row.deleted_at),
    )


async def read_tiers(engine: AsyncEngine, event_id: str) -> list[TierRow]:
    c = coupon_tiers.c
    query = (
        select(c.name, c.discount_type, c.amount, c.percent, c.max_amount, c.share, c.quantity)
        .where(c.event_id == event_id)
        .order_by(c.id)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    return [TierRow(*row) for row in rows]


async def mark_deleted(engine: AsyncEngine, event_id: str) -> bool:
    """Mark the event deleted (history kept); False when there was no live row to mark."""
    stmt = (
        update(coupon_events)
        .where(coupon_events.c.id == event_id, coupon_events.c.deleted_at.is_(None))
        .values(deleted_at=func.now(3), updated_at=func.now(3))
    )
    async with engine.begin() as conn:
        result = await conn.execute(stmt)
    return result.rowcount > 0


async def persisted_count(engine: AsyncEngine, event_id: str) -> int:
    """How many of the event's coupons have reached MySQL."""
    query = (
        select(func.count()).select_from(user_coupons).where(user_coupons.c.event_id == event_id)
    )
    async with engine.connect() as conn:
        return int((await conn.execute(query)).scalar_one())


async def live_event_ids(engine: AsyncEngine) -> list[str]:
    """Ids of the catalog's events that are not marked deleted."""
    query = select(coupon_events.c.id).where(coupon_events.c.deleted_at.is_(None))
    async with engine.connect() as conn:
        return [row.id for row in await conn.execute(query)]
