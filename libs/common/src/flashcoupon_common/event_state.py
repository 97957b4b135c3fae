"""An event's runtime state in Redis: provision, read, pause, delete, list what was issued.

Provisioning writes a few small hashes and nothing per coupon: codes and tiers are derived at
issue time (coupon_math), so a 10 M coupon event is provisioned in one script call and a crash
can only happen before or after it — a re-run completes exactly (the script is idempotent and
never touches the counters except to create them). Re-applying with a higher quantity raises
the caps; a quantity below what was issued is refused with ProvisionError. Layout:
docs/redis-layout.md.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from redis.asyncio.cluster import RedisCluster

from flashcoupon_common import keys
from flashcoupon_common.coupon_math import code_prefix, phase, tier_caps
from flashcoupon_common.event_spec import EventSpec
from flashcoupon_common.lua import PROVISION
from flashcoupon_common.messages import CouponIssued, Discount
from flashcoupon_common.validation import DNS_LABEL, EVENT_ID

_RETRIES = 20


class ProvisionError(ValueError):
    """The spec cannot be applied to the event's current state; the message says why."""


@dataclass(frozen=True, slots=True)
class EventState:
    event_id: str
    quantity: int
    issued: int
    paused: bool
    start_at: datetime
    end_at: datetime
    per_user_limit: int
    tier_quantities: dict[str, int]  # current cap per tier (sums to quantity)
    issued_by_tier: dict[str, int]
    version: int  # bumped by every provision

    @property
    def remaining(self) -> int:
        return max(0, self.quantity - self.issued)

    def phase(self, now: datetime | None = None) -> str:
        """Ready | Active | SoldOut | Ended at `now` (default: this machine's clock)."""
        now_ms = to_ms(now) if now is not None else int(time.time() * 1000)
        return phase(
            now_ms,
            start_ms=to_ms(self.start_at),
            end_ms=to_ms(self.end_at),
            remaining=self.remaining,
        )


def to_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def validate_event_id(event_id: str) -> None:
    if not EVENT_ID.ok(event_id):
        raise ProvisionError(f"event id {event_id!r} must be {EVENT_ID.rule}")


def validate_spec(spec: EventSpec) -> None:
    validate_event_id(spec.event_id)
    if spec.quantity <= 0:
        raise ProvisionError("quantity must be > 0")
    if not spec.tiers:
        raise ProvisionError("an event needs at least one tier")
    if sum(t.share for t in spec.tiers) != 100:
        raise ProvisionError("tier shares must sum to 100")
    if len({t.name for t in spec.tiers}) != len(spec.tiers):
        raise ProvisionError("tier names must be unique")
    for tier in spec.tiers:
        # As the CRD says; the outbox entry relies on it too (CouponIssued.to_outbox).
        if not DNS_LABEL.ok(tier.name):
            raise ProvisionError(f"tier name {tier.name!r} must be {DNS_LABEL.rule}")
    if spec.end_at <= spec.start_at:
        raise ProvisionError("endAt must be after startAt")
    if spec.per_user_limit < 1:
        raise ProvisionError("perUserLimit must be >= 1")


def _tier_fields(discount: Discount) -> list[str]:
    def s(v: int | None) -> str:
        return "" if v is None else str(v)

    return [discount.type, s(discount.amount), s(discount.percent), s(discount.max_amount)]


def _b(v: bytes | str | None) -> str | None:
    return v.decode() if isinstance(v, bytes) else v


async def provision(
    redis: RedisCluster,
    spec: EventSpec,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Create or update the event's runtime state; safe to repeat and to re-run after a crash."""
    validate_spec(spec)
    eid = spec.event_id
    cfg, stock = keys.config_key(eid), keys.stock_key(eid)
    # Registered first: a crash after this leaves a listed event without state, which readers
    # treat as "not provisioned"; never state that relays cannot find.
    await redis.sadd(keys.EVENTS_REGISTRY, eid)
    if progress:
        progress(0, spec.quantity)
    targets = spec.tier_quantities()
    nt = len(spec.tiers)
    for _ in range(_RETRIES):
        old_nt = int(_b(await redis.hget(cfg, "nt")) or 0)
        width = max(nt, old_nt)
        stock_vals = await redis.hmget(stock, ["n", *(f"i{k}" for k in range(1, width + 1))])
        issued_total = int(stock_vals[0] or 0)
        issued = [int(v or 0) for v in stock_vals[1:]]
        if issued_total > 0:
            await _check_tiers_unchanged(redis, cfg, spec, old_nt)
        try:
            caps = tier_caps([targets[t.name] for t in spec.tiers], issued[:nt], spec.quantity)
        except ValueError as exc:
            raise ProvisionError(f"event {eid}: {exc}; lowering below issued is refused") from None
        secret = secrets.token_hex(16)
        args: list[str | int] = [
            spec.to_json().decode(),
            to_ms(spec.start_at),
            to_ms(spec.end_at),
            spec.per_user_limit,
            int(spec.valid_for.total_seconds() * 1000),
            eid,
            secret,
            code_prefix(secret),
            spec.quantity,
            nt,
        ]
        for tier, cap in zip(spec.tiers, caps, strict=True):
            args += [tier.name, *_tier_fields(tier.discount), cap]
        reply = await redis.eval(PROVISION.source, 2, cfg, stock, *args)
        status = _b(reply[0])
        if status == "OK":
            if progress:
                progress(spec.quantity, spec.quantity)
            return
        if status == "BELOW":
            raise ProvisionError(
                f"event {eid}: quantity {spec.quantity} is below the {reply[1]} coupons "
                "already issued; lowering below issued is refused"
            )
        # RETRY: issuance moved a tier past the cap computed from our read; read again.
    raise ProvisionError(f"event {eid}: supply kept changing under provisioning; try again")


async def _check_tiers_unchanged(
    redis: RedisCluster, cfg: str, spec: EventSpec, old_nt: int
) -> None:
    fields = [f"{f}{k}" for k in range(1, old_nt + 1) for f in ("tn", "dt", "da", "dp", "dm")]
    old = [_b(v) for v in await redis.hmget(cfg, fields)] if fields else []
    new: list[str | None] = []
    for tier in spec.tiers:
        new += [tier.name, *_tier_fields(tier.discount)]
    if old != new:
        raise ProvisionError(
            f"event {spec.event_id}: tiers (names, order, discounts) cannot change once "
            "coupons were issued; raise the quantity or create a new event"
        )


async def read_state(redis: RedisCluster, event_id: str) -> EventState | None:
    cfg_vals = await redis.hmget(
        keys.config_key(event_id), ["start", "end", "limit", "paused", "nt", "ver"]
    )
    if cfg_vals[0] is None:
        return None
    start, end, limit, paused, nt, ver = (_b(v) for v in cfg_vals)
    n_tiers = int(nt or 0)
    names = [
        _b(v) or ""  # type: ignore[arg-type]
        for v in await _hmget_list(redis, keys.config_key(event_id), "tn", n_tiers)
    ]
    fields = ["n", "q"] + [f"{p}{k}" for k in range(1, n_tiers + 1) for p in ("c", "i")]
    st = [int(v or 0) for v in await redis.hmget(keys.stock_key(event_id), fields)]
    return EventState(
        event_id=event_id,
        quantity=st[1],
        issued=st[0],
        paused=paused == "1",
        start_at=from_ms(int(start or 0)),
        end_at=from_ms(int(end or 0)),
        per_user_limit=int(limit or 1),
        tier_quantities={names[k]: st[2 + 2 * k] for k in range(n_tiers)},
        issued_by_tier={names[k]: st[3 + 2 * k] for k in range(n_tiers)},
        version=int(ver or 0),
    )


async def _hmget_list(redis: RedisCluster, key: str, prefix: str, count: int) -> list[object]:
    if count == 0:
        return []
    return list(await redis.hmget(key, [f"{prefix}{k}" for k in range(1, count + 1)]))


async def read_spec(redis: RedisCluster, event_id: str) -> EventSpec | None:
    raw = await redis.hget(keys.config_key(event_id), "spec")
    return None if raw is None else EventSpec.from_json(raw)


async def set_paused(redis: RedisCluster, event_id: str, paused: bool) -> None:
    """Pause or resume issuing; ProvisionError if the event is not provisioned."""
    script = (
        "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end "
        "redis.call('HSET', KEYS[1], 'paused', ARGV[1]) "
        "redis.call('HINCRBY', KEYS[1], 'ver', 1) return 1"
    )
    done = await redis.eval(script, 1, keys.config_key(event_id), "1" if paused else "0")
    if not done:
        raise ProvisionError(f"event {event_id} is not provisioned")


async def delete_state(redis: RedisCluster, event_id: str) -> None:
    """Remove every runtime key of the event (outbox included) and unregister it."""
    # One DEL: the keys share a slot, so the cluster client sends them to one node.
    await redis.delete(*keys.event_keys(event_id))
    await redis.srem(keys.EVENTS_REGISTRY, event_id)
    # Issuers drop what they remember about the event (sold-out flag, metric series).
    await redis.publish(keys.SUPPLY_CHANNEL, event_id)


async def iter_issued(redis: RedisCluster, event_id: str) -> AsyncIterator[CouponIssued]:
    """Every coupon the event's Redis state holds (from the users hash, not the outbox)."""
    cfg = keys.config_key(event_id)
    head = [_b(v) for v in await redis.hmget(cfg, ["nt", "vf"])]
    if head[0] is None:
        return
    n_tiers, valid_for = int(head[0]), int(head[1] or 0)
    tiers: dict[str, tuple[str, Discount]] = {}
    for k in range(1, n_tiers + 1):
        tn, dt, da, dp, dm = (
            _b(v)
            for v in await redis.hmget(cfg, [f"tn{k}", f"dt{k}", f"da{k}", f"dp{k}", f"dm{k}"])
        )
        tiers[str(k)] = (tn or "", _discount(dt, da, dp, dm))
    async for user, value in redis.hscan_iter(keys.users_key(event_id), count=1000):
        for seq, (code, tier, at, rid) in enumerate(parse_holdings(_b(value) or ""), start=1):
            name, discount = tiers[tier]
            yield CouponIssued(
                event_id=event_id,
                user_id=_b(user) or "",
                seq=seq,
                code=code,
                tier=name,
                discount=discount,
                issued_at_ms=int(at),
                expires_at_ms=int(at) + valid_for,
                request_id=rid,
            )


def parse_holdings(value: str) -> list[tuple[str, str, str, str]]:
    """A users-hash value → (code, tier index, issued at ms, request id) per coupon."""
    out = []
    for entry in value.split(";"):
        if entry:
            code, tier, at, rid = entry.split(",", 3)
            out.append((code, tier, at, rid))
    return out


def _discount(dt: str | None, da: str | None, dp: str | None, dm: str | None) -> Discount:
    return Discount(
        "fixed" if dt == "fixed" else "percent",
        amount=int(da) if da else None,
        percent=int(dp) if dp else None,
        max_amount=int(dm) if dm else None,
    )
