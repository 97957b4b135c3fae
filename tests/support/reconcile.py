"""Reconcile-plan test fixtures: tiers, the phases' instants and an event spec to plan for."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from flashcoupon_common.event_spec import EventSpec, TierSpec
from flashcoupon_common.event_state import EventState
from flashcoupon_common.messages import Discount

START = datetime(2026, 11, 27, 5, 0, tzinfo=UTC)
END = START + timedelta(hours=9)
BEFORE = START - timedelta(hours=1)  # before warm-up (10 m)
WARMING = START - timedelta(minutes=5)
DURING = START + timedelta(minutes=1)
AFTER = END + timedelta(seconds=1)


def spec(**changes: object) -> EventSpec:
    base = EventSpec("bf", "Black Friday", 1000, START, END, (BIG, SMALL))
    return dataclasses.replace(base, **changes)


def State(
    quantity: int = 1000,
    issued: int = 0,
    paused: bool = False,
    start_at: datetime = START,
    end_at: datetime = END,
    issued_by_tier: Mapping[str, int] | None = None,
) -> EventState:
    """The real runtime-state value type, as event_state.read_state returns it."""
    return EventState(
        event_id="bf",
        quantity=quantity,
        issued=issued,
        paused=paused,
        start_at=start_at,
        end_at=end_at,
        per_user_limit=1,
        tier_quantities=spec(quantity=quantity).tier_quantities(),
        issued_by_tier=dict(issued_by_tier or {}),
        version=1,
    )


BIG = TierSpec("big", Discount("fixed", amount=10_000), 10)
SMALL = TierSpec("small", Discount("percent", percent=5, max_amount=3000), 90)
