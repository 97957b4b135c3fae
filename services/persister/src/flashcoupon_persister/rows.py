"""A coupon as a `user_coupons` row, and what an absorbed row means: pure, no database.

`to_row` gives the INSERT parameters (timestamps as DATETIME text, the cheapest form for the
driver); `judge` decides, from what the table holds for a batch's codes after the upsert, which
records are stored (new or true duplicates) and which conflict. The subtle part is in `judge`:
the upsert absorbs a duplicate and a conflict alike, so only the holder of each code tells them
apart. The writer (writer.py) runs the statements.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from flashcoupon_common.messages import CouponIssued

Slot = tuple[str, str, int]  # (event_id, user_id, seq)

COLUMNS = (
    "event_id",
    "user_id",
    "seq",
    "code",
    "tier",
    "discount_type",
    "amount",
    "percent",
    "max_amount",
    "issued_at",
    "expires_at",
    "request_id",
)
INSERT_SQL = (
    f"INSERT INTO user_coupons ({', '.join(COLUMNS)}) "
    f"VALUES ({', '.join(['%s'] * len(COLUMNS))}) ON DUPLICATE KEY UPDATE id=id"
)
_EPOCH = datetime(1970, 1, 1)
_MAX_SECOND = 253402300800  # 10000-01-01T00:00:00Z


@dataclass(frozen=True, slots=True)
class Rejected:
    """A record that can never be stored, with why (becomes DLQ headers)."""

    index: int  # position in the batch given to write()
    reason: str  # "conflict" | "constraint" | "invalid"
    code: str  # CODE_CONFLICT, SLOT_CONFLICT, MYSQL_<errno>, INVALID_VALUE
    detail: str


@functools.lru_cache(maxsize=8192)
def _utc_second(second: int) -> str:
    return (_EPOCH + timedelta(seconds=second)).isoformat(" ")


def utc_text(ms: int) -> str:
    """Epoch milliseconds as a naive-UTC DATETIME(3) literal, 'YYYY-MM-DD HH:MM:SS.fff'.

    Text rather than a datetime because the driver's datetime escaping was the largest single
    cost per row; a burst's timestamps share their seconds, so the cache makes this cheap.
    """
    second, milli = divmod(ms, 1000)
    if not 0 <= second < _MAX_SECOND:
        raise ValueError(f"timestamp {ms} ms is outside DATETIME's range")
    return f"{_utc_second(second)}.{milli:03d}"


def to_row(c: CouponIssued) -> tuple[Any, ...]:
    """The INSERT parameters for one coupon; timestamps as naive UTC."""
    d = c.discount
    return (
        c.event_id,
        c.user_id,
        c.seq,
        c.code,
        c.tier,
        d.type,
        d.amount,
        d.percent,
        d.max_amount,
        utc_text(c.issued_at_ms),
        utc_text(c.expires_at_ms),
        c.request_id,
    )


def judge(
    coupons: Sequence[tuple[int, CouponIssued]],
    by_code: Mapping[str, Slot],
    by_slot: Mapping[Slot, str] | None = None,
) -> tuple[int, list[Rejected]]:
    """After the upsert, which records are stored (new or true duplicates) and which conflict.

    by_code is what the table holds for the batch's codes. A record whose code is held by its
    own slot is stored. A code held by another slot is CODE_CONFLICT. A code the table does not
    hold means the insert was absorbed by the slot key: that slot has a different code,
    SLOT_CONFLICT (by_slot, when given, names it). Returns (stored, rejected).
    """
    stored = 0
    rejected: list[Rejected] = []
    for index, c in coupons:
        slot: Slot = (c.event_id, c.user_id, c.seq)
        holder = by_code.get(c.code)
        if holder == slot:
            stored += 1
        elif holder is not None:
            rejected.append(
                Rejected(
                    index,
                    "conflict",
                    "CODE_CONFLICT",
                    f"code {c.code} is already held by event={holder[0]} user={holder[1]} "
                    f"seq={holder[2]}",
                )
            )
        else:
            other = (by_slot or {}).get(slot)
            rejected.append(
                Rejected(
                    index,
                    "conflict",
                    "SLOT_CONFLICT",
                    f"slot event={c.event_id} user={c.user_id} seq={c.seq} already holds "
                    f"code {other or '<another code>'}, not {c.code}",
                )
            )
    return stored, rejected
