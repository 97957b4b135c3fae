"""Executing reconcile plans against Redis and MySQL: observe, apply, status, delete, pause.

This is the I/O edge of provisioning; the decisions are in `reconcile.py`. `couponctl` calls
these functions directly and the kopf operator wraps them in handlers.

Order matters in `apply`: the catalog row is written before Redis is preloaded, because the
persister's `user_coupons` rows reference it and the first coupon can follow the preload within
milliseconds. Every step is idempotent (an upsert; `event_state.provision` completes a crashed
run), so a failed apply is repaired by applying again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from flashcoupon_common import event_state, keys
from flashcoupon_common.event_spec import EventSpec
from redis.asyncio.cluster import RedisCluster
from sqlalchemy.ext.asyncio import AsyncEngine

from flashcoupon_operator import catalog
from flashcoupon_operator.model import EventStatus
from flashcoupon_operator.reconcile import Action, Observed, Plan, phase, plan

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


class Rejected(Exception):
    """The spec cannot be applied; nothing was changed. `plan.rejection` says why."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        super().__init__(plan.rejection)


class NotPersisted(Exception):
    """Delete refused: issued coupons have not all reached MySQL yet."""


class NotFound(LookupError):
    """No event of that name in Redis or in the catalog."""


def utcnow() -> datetime:
    return datetime.now(UTC)


async def observe(redis: RedisCluster, engine: AsyncEngine, event_id: str) -> Observed:
    state = await event_state.read_state(redis, event_id)
    provisioned = await event_state.read_spec(redis, event_id) if state is not None else None
    row = await catalog.read_event(engine, event_id)
    # Only needed to detect lost Redis state, so only counted when there is none.
    persisted = await catalog.persisted_count(engine, event_id) if state is None else 0
    return Observed(state=state, provisioned=provisioned, catalog=row, persisted=persisted)


async def apply(
    desired: EventSpec,
    *,
    redis: RedisCluster,
    engine: AsyncEngine,
    now: datetime | None = None,
    preload_now: bool = False,
    progress: Progress | None = None,
) -> Plan:
    """Plan and execute; raises Rejected (nothing changed) or the step's error (re-apply)."""
    observed = await observe(redis, engine, desired.event_id)
    decided = plan(desired, observed, now or utcnow(), preload_now=preload_now)
    if decided.rejected:
        raise Rejected(decided)
    paused = observed.state is not None and observed.state.paused
    for action in decided.actions:
        logger.info("event %s: %s", desired.event_id, action.value)
        if action is Action.WRITE_CATALOG:
            await catalog.upsert_event(engine, desired)
        elif action is Action.RESET_STATE:
            await event_state.delete_state(redis, desired.event_id)
        elif action is Action.PROVISION:
            try:
                await event_state.provision(redis, desired, progress=progress)
            except event_state.ProvisionError as exc:
                # Issuance raced the plan (more issued since we read): refuse like a plan, and
                # put back the catalog row so MySQL keeps describing what Redis runs.
                if observed.provisioned is not None:
                    await catalog.upsert_event(engine, observed.provisioned)
                refused = Plan(desired.event_id, changes=decided.changes, rejection=str(exc))
                raise Rejected(refused) from None
            if paused and Action.RESET_STATE in decided.actions:
                # A re-preload starts from scratch; an emergency pause must survive it.
                await event_state.set_paused(redis, desired.event_id, True)
    return decided


async def status(
    redis: RedisCluster, engine: AsyncEngine, event_id: str, now: datetime | None = None
) -> EventStatus:
    now = now or utcnow()
    state = await event_state.read_state(redis, event_id)
    row = await catalog.read_event(engine, event_id)
    spec = await event_state.read_spec(redis, event_id) if state is not None else None
    spec = spec or (row.spec if row else None)
    if spec is None:
        raise NotFound(f"no CouponEvent named {event_id!r} (neither in Redis nor in MySQL)")
    persisted = await catalog.persisted_count(engine, event_id)
    deleted_at = row.deleted_at if row else None
    tiers: tuple[tuple[str, int, int | None], ...]
    if state is not None:
        tiers = tuple(
            (name, cap, state.issued_by_tier.get(name, 0))
            for name, cap in state.tier_quantities.items()
        )
    else:
        tiers = tuple((name, cap, None) for name, cap in spec.tier_quantities().items())
    return EventStatus(
        event_id=event_id,
        phase=None if deleted_at else phase(spec, state, now),
        quantity=state.quantity if state else spec.quantity,
        issued=state.issued if state else None,
        remaining=state.remaining if state else None,
        persisted=persisted,
        start_at=state.start_at if state else spec.start_at,
        end_at=state.end_at if state else spec.end_at,
        paused=bool(state and state.paused),
        deleted_at=deleted_at,
        tiers=tiers,
    )


async def delete(
    redis: RedisCluster, engine: AsyncEngine, event_id: str, *, force: bool = False
) -> tuple[bool, bool]:
    """Drop the Redis state and mark the catalog row; (had Redis state, marked a row).

    Refuses (NotPersisted) while MySQL holds fewer coupons than Redis issued: the outbox still
    carries them, and deleting the state would lose coupons shoppers were told they have.
    Idempotent: deleting again finds nothing and changes nothing. Redis goes first so that no
    coupon is issued for an event the catalog already calls deleted.
    """
    state = await event_state.read_state(redis, event_id)
    had_state = state is not None
    if state is not None and state.issued > 0 and not force:
        persisted = await catalog.persisted_count(engine, event_id)
        if persisted < state.issued:
            raise NotPersisted(
                f"{state.issued - persisted:,} of the {state.issued:,} coupons issued by "
                f"{event_id!r} are not in MySQL yet; wait for the persister"
            )
    await event_state.delete_state(redis, event_id)
    marked = await catalog.mark_deleted(engine, event_id)
    return had_state, marked


async def set_paused(redis: RedisCluster, event_id: str, paused: bool) -> None:
    """The emergency switch: the issue script refuses while paused. NotFound if not preloaded."""
    try:
        await event_state.set_paused(redis, event_id, paused)
    except event_state.ProvisionError as exc:
        raise NotFound(str(exc)) from None


async def list_events(
    redis: RedisCluster, engine: AsyncEngine, now: datetime | None = None
) -> list[EventStatus]:
    """Every live event: in the catalog (not deleted) or registered in Redis, by name."""
    names = set(await catalog.live_event_ids(engine))
    names |= {_text(n) for n in await redis.smembers(keys.EVENTS_REGISTRY)}
    found = []
    for name in sorted(names):
        try:
            found.append(await status(redis, engine, name, now))
        except NotFound:
            continue  # registered by a provision that crashed before writing any state
    return found


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
