"""The wallet's MySQL queries (SQLAlchemy Core over flashcoupon_common.db.schema).

Redemption needs no lock: the UPDATE's WHERE clause (owner, status='issued', not expired) is
the decision, and InnoDB serialises concurrent UPDATEs of one row, so exactly one of them
matches. Every read ends its own transaction: under REPEATABLE READ a read in the same
transaction as an earlier SELECT would see the old snapshot, not the winner's commit. The one
write transaction is the UPDATE plus, only when it matched, the `coupon-redeemed` outbox entry:
the event is durable exactly when the redemption is, and a replay (no match) adds nothing.
Times in DATETIME columns are UTC, compared with UTC_TIMESTAMP(3) so the server's time zone
does not matter.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flashcoupon_common.db.schema import coupon_events, user_coupons
from flashcoupon_common.messages import Discount
from sqlalchemy import Row, Update, and_, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from flashcoupon_wallet import outbox
from flashcoupon_wallet.redemption import (
    CouponRow,
    RedeemRequest,
    Redemption,
    TryAgain,
    check_redeemable,
    explain_miss,
    plan,
    redeemed_event,
)

uc = user_coupons
_NOW = func.utc_timestamp(3)

_COLUMNS = (
    uc.c.event_id,
    uc.c.user_id,
    uc.c.code,
    uc.c.tier,
    uc.c.discount_type,
    uc.c.amount,
    uc.c.percent,
    uc.c.max_amount,
    uc.c.status,
    uc.c.issued_at,
    uc.c.expires_at,
    (uc.c.expires_at <= _NOW).label("expired"),
    uc.c.redeemed_at,
    uc.c.order_id,
    uc.c.order_amount,
    uc.c.discount_amount,
)


def _to_row(r: Row[*tuple[Any, ...]]) -> CouponRow:
    m = r._mapping
    return CouponRow(
        event_id=m["event_id"],
        user_id=m["user_id"],
        code=m["code"],
        tier=m["tier"],
        discount=Discount(
            type=m["discount_type"],
            amount=m["amount"],
            percent=m["percent"],
            max_amount=m["max_amount"],
        ),
        status=m["status"],
        issued_at=m["issued_at"],
        expires_at=m["expires_at"],
        expired=bool(m["expired"]),
        redeemed_at=m["redeemed_at"],
        order_id=m["order_id"],
        order_amount=m["order_amount"],
        discount_amount=m["discount_amount"],
    )


async def _fetch(conn: AsyncConnection, code: str) -> CouponRow | None:
    r = (await conn.execute(select(*_COLUMNS).where(uc.c.code == code))).first()
    # End the read's transaction: the next statement must see what others committed since.
    await conn.rollback()
    return None if r is None else _to_row(r)


async def list_user_coupons(engine: AsyncEngine, user_id: str, limit: int) -> list[CouponRow]:
    """Newest first; served by ix_user_coupons_user (user_id, issued_at)."""
    query = (
        select(*_COLUMNS)
        .where(uc.c.user_id == user_id)
        .order_by(uc.c.issued_at.desc(), uc.c.id.desc())
        .limit(limit)
    )
    async with engine.connect() as conn:
        return [_to_row(r) for r in await conn.execute(query)]


async def event_counts(engine: AsyncEngine, event_id: str) -> tuple[bool, int, int]:
    """(event known, persisted rows, redeemed rows).

    GROUP BY status over ix_user_coupons_event_status is an index-only range scan; its cost
    grows with the event's rows (see docs/wallet.md).
    """
    by_status = (
        select(uc.c.status, func.count()).where(uc.c.event_id == event_id).group_by(uc.c.status)
    )
    async with engine.connect() as conn:
        counts = {status: int(n) for status, n in await conn.execute(by_status)}
        known = (
            bool(counts)
            or (await conn.scalar(select(coupon_events.c.id).where(coupon_events.c.id == event_id)))
            is not None
        )
    return known, sum(counts.values()), counts.get("redeemed", 0)


def _redeem_update(r: Redemption) -> Update:
    """The one conditional UPDATE: it matches only an unexpired, issued coupon of this user."""
    return (
        update(uc)
        .where(
            and_(
                uc.c.code == r.code,
                uc.c.user_id == r.user_id,
                uc.c.status == "issued",
                uc.c.expires_at > _NOW,
            )
        )
        .values(
            status="redeemed",
            order_id=r.order_id,
            order_amount=r.order_amount,
            discount_amount=r.discount_amount,
            redeemed_at=r.redeemed_at.astimezone(UTC).replace(tzinfo=None),
        )
    )


async def redeem(
    engine: AsyncEngine, user_id: str, code: str, req: RedeemRequest
) -> tuple[Redemption, bool]:
    """Redeem or explain; returns (answer, True if this call did the redemption).

    Raises a RedemptionError subclass for every refusal. One pooled connection serves the
    whole request in short transactions; a winning call commits its outbox entry with the
    UPDATE, so the caller only has to wake the publisher.
    """
    async with engine.connect() as conn:
        row = check_redeemable(await _fetch(conn, code), user_id)
        for _ in range(2):
            if row.status == "issued" and not row.expired:
                attempt = plan(row, req, datetime.now(UTC))
                won = (await conn.execute(_redeem_update(attempt))).rowcount == 1
                if won:
                    await outbox.add(conn, redeemed_event(attempt))
                await conn.commit()
                if won:
                    return attempt, True
                fresh = await _fetch(conn, code)
            else:
                fresh = row
            replay = explain_miss(fresh, user_id, req)
            if replay is not None:
                return replay, False
            assert fresh is not None  # explain_miss raised CouponNotFound otherwise
            row = fresh
    raise TryAgain("the coupon changed while redeeming it; retry the request")
