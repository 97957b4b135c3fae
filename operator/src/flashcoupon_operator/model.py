"""The operator's plain data: what the catalog stores, what an event looks like from outside.

Kept apart from catalog.py (SQLAlchemy) and runtime.py (Redis) so the decision modules
(reconcile, crstatus) can name these types without importing any I/O library.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from flashcoupon_common.event_spec import EventSpec

Phase = Literal["Pending", "Preloading", "Ready", "Active", "SoldOut", "Ended", "Failed"]


@dataclass(frozen=True, slots=True)
class CatalogRow:
    """An event's catalog entry as stored; `spec` is what was last applied."""

    event_id: str
    quantity: int
    spec: EventSpec
    deleted_at: datetime | None  # aware UTC, or None while the event exists


@dataclass(frozen=True, slots=True)
class TierRow:
    name: str
    discount_type: str
    amount: int | None
    percent: int | None
    max_amount: int | None
    share: int
    quantity: int


@dataclass(frozen=True, slots=True)
class EventStatus:
    event_id: str
    phase: Phase | None  # None once deleted
    quantity: int
    issued: int | None  # None when Redis holds no state (not preloaded, or deleted)
    remaining: int | None
    persisted: int
    start_at: datetime
    end_at: datetime
    paused: bool
    deleted_at: datetime | None = None
    # per tier: (name, quantity, issued or None when Redis holds no state)
    tiers: tuple[tuple[str, int, int | None], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "eventId": self.event_id,
            "phase": self.phase if self.deleted_at is None else "Deleted",
            "quantity": self.quantity,
            "issued": self.issued,
            "remaining": self.remaining,
            "persisted": self.persisted,
            "startAt": self.start_at.isoformat(),
            "endAt": self.end_at.isoformat(),
            "paused": self.paused,
            "deletedAt": None if self.deleted_at is None else self.deleted_at.isoformat(),
            "tiers": [{"name": n, "quantity": q, "issued": i} for n, q, i in self.tiers],
        }
