"""Reconcile plans: which spec changes are applied, which are refused, and why."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone

import pytest
from flashcoupon_common.event_spec import EventSpec, TierSpec
from flashcoupon_common.event_state import EventState
from flashcoupon_common.messages import Discount
from flashcoupon_operator.model import CatalogRow
from flashcoupon_operator.reconcile import Action, Observed, plan

START = datetime(2026, 11, 27, 5, 0, tzinfo=UTC)
END = START + timedelta(hours=9)
BEFORE = START - timedelta(hours=1)  # before warm-up (10 m)
WARMING = START - timedelta(minutes=5)
DURING = START + timedelta(minutes=1)
AFTER = END + timedelta(seconds=1)

BIG = TierSpec("big", Discount("fixed", amount=10_000), 10)
SMALL = TierSpec("small", Discount("percent", percent=5, max_amount=3000), 90)


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


def provisioned(state: EventState | None = None, applied: EventSpec | None = None) -> Observed:
    applied = applied or spec()
    return Observed(
        state=state or State(), provisioned=applied, catalog=CatalogRow("bf", 1000, applied, None)
    )


def test_new_event_before_warmup_writes_catalog_and_waits() -> None:
    p = plan(spec(), Observed(), BEFORE)
    assert p.actions == (Action.WRITE_CATALOG,)
    assert p.preload_at == START - timedelta(minutes=10)
    assert p.changes == ("new event",)
    assert not p.rejected


@pytest.mark.parametrize("now", [WARMING, DURING, AFTER])
def test_new_event_in_or_after_warmup_is_preloaded(now: datetime) -> None:
    p = plan(spec(), Observed(), now)
    assert p.actions == (Action.WRITE_CATALOG, Action.PROVISION)
    assert p.preload_at is None


def test_preload_now_skips_the_warmup_wait() -> None:
    p = plan(spec(), Observed(), BEFORE, preload_now=True)
    assert p.actions == (Action.WRITE_CATALOG, Action.PROVISION)


def test_same_spec_again_is_a_no_change_idempotent_provision() -> None:
    p = plan(spec(), provisioned(State(issued=40)), DURING)
    assert p.changes == ()
    assert p.actions == (Action.WRITE_CATALOG, Action.PROVISION)


def test_same_instant_in_another_offset_is_no_change() -> None:
    kst = timezone(timedelta(hours=9))
    p = plan(spec(start_at=START.astimezone(kst)), provisioned(), DURING)
    assert p.changes == () and not p.rejected


def test_raise_quantity_while_active_is_accepted() -> None:
    p = plan(spec(quantity=5000), provisioned(State(issued=1000)), DURING)
    assert not p.rejected
    assert p.changes == ("quantity: 1000 → 5000",)
    assert Action.PROVISION in p.actions and Action.RESET_STATE not in p.actions


def test_lower_quantity_below_issued_is_rejected() -> None:
    p = plan(spec(quantity=500), provisioned(State(issued=600)), DURING)
    assert p.rejection == "spec.quantity: cannot lower to 500: 600 coupons are already issued"
    assert p.actions == ()


def test_lower_quantity_to_exactly_issued_is_accepted() -> None:
    st = State(issued=600, issued_by_tier={"big": 60, "small": 540})
    assert not plan(spec(quantity=600), provisioned(st), DURING).rejected


def test_lower_quantity_that_starves_a_tier_is_rejected() -> None:
    # 700 total keeps room overall, but "big" (10 %) would get 70 while 100 are out.
    st = State(issued=600, issued_by_tier={"big": 100, "small": 500})
    p = plan(spec(quantity=700), provisioned(st), DURING)
    assert p.rejection is not None and "tier 'big'" in p.rejection


def test_move_start_before_start_is_accepted() -> None:
    later = START + timedelta(hours=1)
    p = plan(spec(start_at=later), provisioned(), WARMING)
    assert not p.rejected
    assert p.changes[0].startswith("startAt: ")


def test_move_start_once_active_is_rejected() -> None:
    p = plan(spec(start_at=START + timedelta(hours=1)), provisioned(), DURING)
    assert p.rejection is not None and p.rejection.startswith("spec.startAt: cannot move")


def test_move_end_while_active_is_accepted_but_not_after_end() -> None:
    p = plan(spec(end_at=END + timedelta(hours=1)), provisioned(), DURING)
    assert not p.rejected
    p = plan(spec(end_at=END + timedelta(hours=1)), provisioned(), AFTER)
    assert p.rejection is not None and p.rejection.startswith("spec.endAt: the event ended")


def test_reapply_of_an_ended_event_unchanged_is_not_rejected() -> None:
    assert not plan(spec(), provisioned(State(issued=1000)), AFTER).rejected


def test_tier_change_before_start_with_nothing_issued_resets_and_preloads() -> None:
    tiers = (dataclasses.replace(BIG, share=20), dataclasses.replace(SMALL, share=80))
    p = plan(spec(tiers=tiers), provisioned(), WARMING)
    assert p.actions == (Action.WRITE_CATALOG, Action.RESET_STATE, Action.PROVISION)


def test_tier_change_once_active_is_rejected() -> None:
    tiers = (dataclasses.replace(BIG, share=20), dataclasses.replace(SMALL, share=80))
    p = plan(spec(tiers=tiers), provisioned(), DURING)
    assert p.rejection is not None and p.rejection.startswith("spec.tiers: cannot change")


def test_per_user_limit_change_after_issuance_is_rejected() -> None:
    p = plan(spec(per_user_limit=3), provisioned(State(issued=1)), WARMING)
    assert p.rejection is not None and p.rejection.startswith("spec.perUserLimit: ")


def test_title_and_admission_changes_are_accepted_while_active() -> None:
    p = plan(spec(title="New title"), provisioned(State(issued=10)), DURING)
    assert not p.rejected and p.changes == ("title: Black Friday → New title",)


def test_deleted_name_with_coupons_in_mysql_is_not_reused() -> None:
    row = CatalogRow("bf", 1000, spec(), datetime(2026, 11, 1, tzinfo=UTC))
    p = plan(spec(), Observed(catalog=row, persisted=3), BEFORE)
    assert p.rejection is not None and "use a new metadata.name" in p.rejection


def test_deleted_name_without_coupons_is_applied_again() -> None:
    row = CatalogRow("bf", 1000, spec(), datetime(2026, 11, 1, tzinfo=UTC))
    p = plan(spec(), Observed(catalog=row), DURING)
    assert p.actions == (Action.WRITE_CATALOG, Action.PROVISION)
    assert p.changes == ("new event",)


def test_lost_redis_state_with_persisted_coupons_is_refused() -> None:
    row = CatalogRow("bf", 1000, spec(), None)
    p = plan(spec(), Observed(catalog=row, persisted=12), DURING)
    assert p.rejection is not None and "auditor" in p.rejection


def test_catalog_only_event_is_edited_freely_before_preload() -> None:
    row = CatalogRow("bf", 1000, spec(), None)
    p = plan(spec(quantity=10), Observed(catalog=row), BEFORE)
    assert p.actions == (Action.WRITE_CATALOG,)
    assert p.changes == ("quantity: 1000 → 10",)
