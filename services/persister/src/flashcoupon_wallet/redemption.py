"""Redemption decisions as plain functions: input validation, the discount, and the answer.

The store runs one conditional UPDATE (status='issued', owner, not expired) and only when it
matches nothing does it read the row again; `explain_miss` then decides what the shopper is
told. The subtle case is the replay: a coupon already redeemed *for the same orderId* answers
the stored result again with 200, so a client that retries after a lost response is safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from flashcoupon_common import validation
from flashcoupon_common.messages import CouponRedeemed, Discount

MAX_USER_ID = 128  # user_coupons.user_id is VARCHAR(128)


class RedemptionError(Exception):
    """A redemption refused for a reason the shopper can act on; `code` is stable."""

    status: int
    code: str

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class CouponNotFound(RedemptionError):
    status = 404
    code = "COUPON_NOT_FOUND"


class NotYourCoupon(RedemptionError):
    status = 403
    code = "NOT_YOUR_COUPON"


class AlreadyRedeemed(RedemptionError):
    status = 409
    code = "ALREADY_REDEEMED"


class Expired(RedemptionError):
    status = 410
    code = "EXPIRED"


class TryAgain(RedemptionError):
    """The row changed under us twice in a row; the client may simply retry."""

    status = 503
    code = "TRY_AGAIN"


@dataclass(frozen=True, slots=True)
class RedeemRequest:
    order_id: str
    order_amount: int


@dataclass(frozen=True, slots=True)
class CouponRow:
    """What the wallet reads of one user_coupons row."""

    event_id: str
    user_id: str
    code: str
    tier: str
    discount: Discount
    status: str  # issued | redeemed | expired
    issued_at: datetime
    expires_at: datetime
    expired: bool  # expires_at <= the database clock, evaluated by the query
    redeemed_at: datetime | None = None
    order_id: str | None = None
    order_amount: int | None = None
    discount_amount: int | None = None


@dataclass(frozen=True, slots=True)
class Redemption:
    """A successful (or replayed) redemption; what the shopper is answered."""

    event_id: str
    user_id: str
    code: str
    order_id: str
    order_amount: int
    discount_amount: int
    redeemed_at: datetime

    @property
    def pay_amount(self) -> int:
        return self.order_amount - self.discount_amount

    def to_json(self) -> dict[str, Any]:
        return {
            "couponCode": self.code,
            "orderId": self.order_id,
            "orderAmount": self.order_amount,
            "discountAmount": self.discount_amount,
            "payAmount": self.pay_amount,
            "redeemedAt": iso_utc(self.redeemed_at),
        }


def parse_request(body: dict[str, Any]) -> RedeemRequest:
    """Validate a redeem body with the rules the gateway also applies (422 INVALID_REQUEST)."""
    return RedeemRequest(
        order_id=validation.order_id(body), order_amount=validation.order_amount(body)
    )


def check_redeemable(row: CouponRow | None, user_id: str) -> CouponRow:
    """Before the UPDATE: unknown code → 404, someone else's → 403 (cheap, no write)."""
    if row is None:
        raise CouponNotFound("no coupon has this code")
    if row.user_id != user_id:
        raise NotYourCoupon("this coupon belongs to another user")
    return row


def plan(row: CouponRow, req: RedeemRequest, now: datetime) -> Redemption:
    """The redemption the conditional UPDATE will try to record."""
    return Redemption(
        event_id=row.event_id,
        user_id=row.user_id,
        code=row.code,
        order_id=req.order_id,
        order_amount=req.order_amount,
        discount_amount=row.discount.apply(req.order_amount),
        redeemed_at=truncate_ms(now),
    )


def explain_miss(row: CouponRow | None, user_id: str, req: RedeemRequest) -> Redemption | None:
    """The UPDATE matched no row: say why, or return the stored answer for a replay.

    Returns None only when the row still looks redeemable (it cannot, after a miss, unless the
    UPDATE raced a clock edge); the caller then simply tries the UPDATE again.
    """
    row = check_redeemable(row, user_id)
    if row.status == "redeemed":
        if row.order_id != req.order_id:
            raise AlreadyRedeemed(f"coupon already used for order {row.order_id}")
        assert row.redeemed_at is not None and row.order_amount is not None
        if row.order_amount != req.order_amount:
            # Same order id, different amount: a client bug; replaying the old answer would
            # misstate the discount, so say so instead.
            raise AlreadyRedeemed(
                f"coupon already used for order {row.order_id} "
                f"with orderAmount {row.order_amount}, not {req.order_amount}"
            )
        return stored_redemption(row)
    if row.status == "expired" or row.expired:
        raise Expired(f"coupon expired at {iso_utc(row.expires_at)}")
    return None


def stored_redemption(row: CouponRow) -> Redemption:
    assert row.order_id is not None and row.order_amount is not None
    assert row.discount_amount is not None and row.redeemed_at is not None
    return Redemption(
        event_id=row.event_id,
        user_id=row.user_id,
        code=row.code,
        order_id=row.order_id,
        order_amount=row.order_amount,
        discount_amount=row.discount_amount,
        redeemed_at=row.redeemed_at,
    )


def redeemed_event(r: Redemption) -> CouponRedeemed:
    """The `coupon-redeemed` message of a redemption, as the outbox stores it."""
    return CouponRedeemed(
        event_id=r.event_id,
        user_id=r.user_id,
        code=r.code,
        order_id=r.order_id,
        order_amount=r.order_amount,
        discount_amount=r.discount_amount,
        redeemed_at_ms=int(r.redeemed_at.timestamp() * 1000),
    )


def display_status(row: CouponRow) -> str:
    """The status a shopper sees: an issued coupon past its expiry is shown as expired."""
    if row.status == "issued" and row.expired:
        return "expired"
    return row.status


def truncate_ms(moment: datetime) -> datetime:
    """DATETIME(3) keeps milliseconds; truncate first so the replay answers the same value."""
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def iso_utc(moment: datetime) -> str:
    """ISO-8601 with a Z; naive datetimes from MySQL are UTC by convention."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
