"""Reconcile decisions: what applying a CouponEvent spec should do, and which phase it is in.

Pure functions, no I/O: `plan()` compares the desired spec with what is observed (the Redis
runtime state, the spec provisioned there, the MySQL catalog row) at a given instant, and
returns the actions to take or a rejection; `phase()` names the lifecycle phase. The kopf
operator and `couponctl` both call these, and `runtime.py` executes a plan.

The rules, and why:
* quantity may rise at any time; it may fall only as far as what is already issued, overall and
  per tier (the per-tier totals are exact, so each tier must keep room for what it handed out);
* startAt may move only before the event starts (moving an open door is unfair to the shoppers
  already in); endAt may move until the event has ended, and an ended event stays ended;
* tiers and perUserLimit shape the runtime state, so they may change only before the start and
  while nothing was issued; that change re-preloads the event from scratch;
* a deleted event's name is reused only if none of its coupons reached MySQL: they stay there
  under that id, and new coupons would collide with them;
* Redis state gone while MySQL holds coupons means Redis lost data: preloading again would hand
  out the same supply twice, so reconcile refuses and points at the auditor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from flashcoupon_common.event_spec import EventSpec

from flashcoupon_operator.model import CatalogRow, Phase


class RuntimeState(Protocol):
    """What reconcile reads from the event's Redis state (event_state.EventState)."""

    @property
    def quantity(self) -> int: ...
    @property
    def issued(self) -> int: ...
    @property
    def remaining(self) -> int: ...
    @property
    def paused(self) -> bool: ...
    @property
    def start_at(self) -> datetime: ...
    @property
    def end_at(self) -> datetime: ...
    @property
    def issued_by_tier(self) -> Mapping[str, int]: ...


@dataclass(frozen=True, slots=True)
class Observed:
    state: RuntimeState | None = None  # Redis runtime state, None when not preloaded
    provisioned: EventSpec | None = None  # the spec Redis was preloaded with
    catalog: CatalogRow | None = None  # MySQL catalog row, deleted ones included
    persisted: int = 0  # coupons of this event in MySQL


class Action(StrEnum):
    WRITE_CATALOG = "write-catalog"  # upsert coupon_events + coupon_tiers
    RESET_STATE = "reset-state"  # drop the Redis state (structural change before the start)
    PROVISION = "provision"  # event_state.provision: idempotent, completes a crashed preload


@dataclass(frozen=True, slots=True)
class Plan:
    event_id: str
    actions: tuple[Action, ...] = ()
    changes: tuple[str, ...] = ()  # what differs from the applied spec, for humans
    rejection: str | None = None  # why the spec cannot be applied; nothing is done then
    preload_at: datetime | None = None  # PROVISION is deferred until then (operator timer)

    @property
    def rejected(self) -> bool:
        return self.rejection is not None


def diff(old: EventSpec | None, new: EventSpec) -> tuple[str, ...]:
    """Human-readable differences between the applied spec and the desired one."""
    if old is None:
        return ("new event",)
    fields = [
        ("title", old.title, new.title),
        ("quantity", old.quantity, new.quantity),
        ("perUserLimit", old.per_user_limit, new.per_user_limit),
        ("startAt", old.start_at.isoformat(), new.start_at.isoformat()),
        ("endAt", old.end_at.isoformat(), new.end_at.isoformat()),
        ("warmup", old.warmup, new.warmup),
        ("coupon.validFor", old.valid_for, new.valid_for),
        ("tiers", old.tiers, new.tiers),
        ("admission", old.admission, new.admission),
    ]
    out = []
    for name, a, b in fields:
        # Equal instants in different offsets are not a change.
        if name in ("startAt", "endAt"):
            same = getattr(old, _attr(name)) == getattr(new, _attr(name))
        else:
            same = a == b
        if not same:
            out.append(f"{name}: {_short(a)} → {_short(b)}")
    return tuple(out)


def _attr(name: str) -> str:
    return {"startAt": "start_at", "endAt": "end_at"}[name]


def _short(value: object) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(f"{t.name}:{t.share}%" for t in value) + "]"
    return str(value)


def plan(
    desired: EventSpec, observed: Observed, now: datetime, *, preload_now: bool = False
) -> Plan:
    """The actions that bring the event to `desired`, or a rejection that changes nothing.

    `preload_now` preloads immediately instead of at `startAt - warmup` (couponctl has no
    timers); the operator leaves it False and sets a timer for `preload_at`.
    """
    event_id = desired.event_id
    catalog = observed.catalog
    live_row = catalog if catalog is not None and catalog.deleted_at is None else None
    applied = observed.provisioned or (live_row.spec if live_row else None)
    changes = diff(applied, desired)

    def reject(reason: str) -> Plan:
        return Plan(event_id, changes=changes, rejection=reason)

    state = observed.state
    if catalog is not None and catalog.deleted_at is not None and observed.persisted > 0:
        return reject(
            f"event {event_id!r} was deleted at {catalog.deleted_at.isoformat()} and its "
            f"{observed.persisted} coupons are kept in MySQL under that name; "
            "use a new metadata.name"
        )
    if state is None:
        if observed.persisted > 0:
            return reject(
                f"Redis holds no state for {event_id!r} but MySQL holds {observed.persisted} of "
                "its coupons: Redis lost data; preloading again would issue the supply twice. "
                "Run the auditor (flashcoupon-auditor) to repair the Redis state first"
            )
        due_at = desired.start_at - desired.warmup
        if preload_now or now >= due_at:
            return Plan(event_id, (Action.WRITE_CATALOG, Action.PROVISION), changes)
        return Plan(event_id, (Action.WRITE_CATALOG,), changes, preload_at=due_at)

    problem = _refusal(desired, applied, state, now)
    if problem:
        return reject(problem)
    actions = [Action.WRITE_CATALOG, Action.PROVISION]
    if applied is not None and _structure(applied) != _structure(desired):
        actions.insert(1, Action.RESET_STATE)
    return Plan(event_id, tuple(actions), changes)


def _structure(spec: EventSpec) -> tuple[object, ...]:
    return (spec.tiers, spec.per_user_limit)


def _refusal(
    desired: EventSpec, applied: EventSpec | None, state: RuntimeState, now: datetime
) -> str | None:
    started = now >= state.start_at
    ended = now >= state.end_at
    if desired.quantity < state.issued:
        return (
            f"spec.quantity: cannot lower to {desired.quantity:,}: "
            f"{state.issued:,} coupons are already issued"
        )
    if applied is not None and _structure(applied) != _structure(desired):
        if started or state.issued > 0:
            what = "spec.tiers" if applied.tiers != desired.tiers else "spec.perUserLimit"
            return (
                f"{what}: cannot change once the event has started or issued coupons "
                f"(issued {state.issued:,}); create a new CouponEvent instead"
            )
    else:
        per_tier = desired.tier_quantities()
        for tier, issued in sorted(state.issued_by_tier.items()):
            if per_tier.get(tier, 0) < issued:
                return (
                    f"spec.quantity: {desired.quantity:,} would give tier {tier!r} "
                    f"{per_tier.get(tier, 0):,} coupons but {issued:,} are already issued"
                )
    if desired.start_at != state.start_at and started:
        return (
            f"spec.startAt: cannot move once the event has started "
            f"(it started at {state.start_at.isoformat()})"
        )
    if desired.end_at != state.end_at and ended:
        return (
            f"spec.endAt: the event ended at {state.end_at.isoformat()} and stays ended; "
            "create a new CouponEvent instead"
        )
    return None


def phase(
    spec: EventSpec,
    state: RuntimeState | None,
    now: datetime,
    *,
    preloaded: bool = True,
    failed: bool = False,
) -> Phase:
    """The lifecycle phase at `now`.

    Pending: not preloaded, before `startAt - warmup`. Preloading: due (or being) preloaded.
    Ready: preloaded, before the start. Active: open with supply left. SoldOut: open, no supply.
    Ended: after `endAt`. Failed: the last apply failed (the operator says why in a condition).
    The window comes from the runtime state when there is one: that is what the script enforces.
    """
    if failed:
        return "Failed"
    if state is None:
        if now >= spec.end_at:
            return "Ended"
        return "Pending" if now < spec.start_at - spec.warmup else "Preloading"
    if now >= state.end_at:
        return "Ended"
    if not preloaded:
        return "Preloading"
    if state.remaining <= 0:
        return "SoldOut"
    return "Active" if now >= state.start_at else "Ready"


def seconds_to_opening(now: datetime, start_at: datetime, interval: float) -> float | None:
    """Seconds until `start_at` when it may come before the next refresh: within two
    `interval`s of now, because the next tick is not `interval` from now but from the end of
    this one (kopf counts it so), and a busy process wakes later still. Looking one interval
    ahead missed openings 1.0–1.3 s away on a loaded box, and a drop that sold out in 0.33 s
    went Ready → SoldOut unseen.

    None when the event has opened already or opens later than that. The operator's refresh
    timer sleeps this long and reads again, so Active is written at startAt to the second even
    when a drop sells out within one tick.
    """
    left = (start_at - now).total_seconds()
    return left if 0 < left < 2 * interval else None
