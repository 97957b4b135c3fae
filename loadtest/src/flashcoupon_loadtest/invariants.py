"""DESIGN.md's invariants, checked after every load run against Redis and MySQL directly.

1. issued ≤ quantity, and = quantity when demand exceeds supply;
2. no user holds more than perUserLimit coupons of an event;
3. codes are unique; per-tier totals match their shares exactly (tier_quantities);
4. after the pipeline drains, MySQL rows = Redis issued records, one for one;
5. every 201 answered to a shopper has its row in MySQL.

The checks are pure functions over plain lists (`Holding`s from Redis and from MySQL, the
shoppers' 201 answers), so each one is unit-tested with planted faults; `check_event` is the
thin I/O layer that reads the stores. Each check returns a `Check` with PASS/FAIL, a one-line
detail and a few examples of what is wrong.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Holding(NamedTuple):
    """One issued coupon, as either store records it."""

    user: str
    seq: int
    code: str
    tier: str


@dataclass(frozen=True)
class Check:
    number: int
    name: str
    passed: bool
    detail: str
    examples: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"

    def to_json(self) -> dict[str, Any]:
        return {
            "invariant": self.number,
            "name": self.name,
            "verdict": self.verdict,
            "detail": self.detail,
            "examples": self.examples,
        }


def _examples(items: Iterable[object], limit: int = 5) -> list[str]:
    return [str(x) for x, _ in zip(items, range(limit), strict=False)]


def check_supply(issued: int, records: int, quantity: int, demand: int) -> Check:
    """1: `issued` is the event's counter, `records` the issued records Redis holds."""
    problems = []
    if issued > quantity or records > quantity:
        problems.append(f"oversold: counter {issued}, records {records} > quantity {quantity}")
    if issued != records:
        problems.append(f"counter {issued} != {records} issued records")
    if demand >= quantity and issued < quantity:
        problems.append(f"undersold: demand {demand} ≥ quantity {quantity} but issued {issued}")
    detail = f"issued {issued} of {quantity} (demand {demand})"
    return Check(
        1,
        "issued ≤ quantity, = quantity when demand exceeds supply",
        not problems,
        detail if not problems else "; ".join(problems),
        problems,
    )


def check_per_user(redis: Sequence[Holding], mysql: Sequence[Holding], limit: int) -> Check:
    """2: nobody holds more than `limit` coupons, in either store."""
    over = []
    for store, rows in (("redis", redis), ("mysql", mysql)):
        counts = Counter(h.user for h in rows)
        over += [f"{store}: {u} holds {n}" for u, n in counts.items() if n > limit]
        over += [f"{store}: {h.user} seq {h.seq}" for h in rows if not 1 <= h.seq <= limit]
    users = len({h.user for h in redis})
    return Check(
        2,
        f"no user holds more than perUserLimit ({limit})",
        not over,
        f"{users} holders, {len(over)} over the limit",
        _examples(over),
    )


def check_codes_and_tiers(
    redis: Sequence[Holding],
    mysql: Sequence[Holding],
    tier_quantities: Mapping[str, int],
    answers: Sequence[tuple[str, str]] = (),
) -> Check:
    """3: codes unique (each store, and across the shoppers' answers); tier totals exact.

    Totals must equal `tier_quantities` when the event sold out, else stay within them.
    """
    problems = []
    for store, rows in (("redis", redis), ("mysql", mysql)):
        dup = [c for c, n in Counter(h.code for h in rows).items() if n > 1]
        problems += [f"{store}: code {c} issued twice" for c in dup]
    owners: dict[str, set[str]] = {}
    for user, code in answers:
        owners.setdefault(code, set()).add(user)
    problems += [f"answers: code {c} given to {sorted(u)}" for c, u in owners.items() if len(u) > 1]
    totals = Counter(h.tier for h in redis)
    sold_out = len(redis) >= sum(tier_quantities.values())
    for tier in sorted(set(totals) | set(tier_quantities)):
        want, got = tier_quantities.get(tier, 0), totals.get(tier, 0)
        if got > want or (sold_out and got != want):
            problems.append(f"tier {tier}: {got} issued, expected {want}")
    split = ", ".join(f"{t} {totals.get(t, 0)}/{q}" for t, q in tier_quantities.items())
    return Check(
        3,
        "codes unique; per-tier totals exact",
        not problems,
        f"{len(redis)} codes; tiers {split}"
        if not problems
        else f"{len(problems)} problems; tiers {split}",
        _examples(problems),
    )


def check_mysql_matches_redis(redis: Sequence[Holding], mysql: Sequence[Holding]) -> Check:
    """4: one MySQL row per Redis record (by code), same user, slot and tier; nothing extra."""
    r_by_code = {h.code: h for h in redis}
    m_by_code = {h.code: h for h in mysql}
    missing = [h for c, h in r_by_code.items() if c not in m_by_code]
    extra = [h for c, h in m_by_code.items() if c not in r_by_code]
    differ = [
        (h, m_by_code[c]) for c, h in r_by_code.items() if c in m_by_code and m_by_code[c] != h
    ]
    passed = not (missing or extra or differ) and len(mysql) == len(redis)
    detail = (
        f"redis {len(redis)}, mysql {len(mysql)}: missing {len(missing)}, "
        f"extra {len(extra)}, mismatched {len(differ)}"
    )
    examples = _examples([f"missing in mysql: {h}" for h in missing])
    examples += _examples([f"extra in mysql: {h}" for h in extra])
    examples += _examples([f"redis {a} != mysql {b}" for a, b in differ])
    return Check(4, "MySQL rows = Redis issued records, one for one", passed, detail, examples)


def check_answers_persisted(answers: Sequence[tuple[str, str]], mysql: Sequence[Holding]) -> Check:
    """5: every (user, couponCode) answered 201 is a MySQL row of that user."""
    rows = {h.code: h.user for h in mysql}
    lost = sorted({(u, c) for u, c in answers if rows.get(c) != u})
    n = len({c for _, c in answers})
    return Check(
        5,
        "every 201 answered has its MySQL row",
        not lost,
        f"{n} coupons answered 201, {len(lost)} without their row",
        _examples(f"{u} was told {c}" for u, c in lost),
    )


def check_all(
    *,
    quantity: int,
    per_user_limit: int,
    tier_quantities: Mapping[str, int],
    issued_counter: int,
    demand: int,
    redis: Sequence[Holding],
    mysql: Sequence[Holding],
    answers: Sequence[tuple[str, str]],
) -> list[Check]:
    return [
        check_supply(issued_counter, len(redis), quantity, demand),
        check_per_user(redis, mysql, per_user_limit),
        check_codes_and_tiers(redis, mysql, tier_quantities, answers),
        check_mysql_matches_redis(redis, mysql),
        check_answers_persisted(answers, mysql),
    ]


def all_passed(checks: Iterable[Check]) -> bool:
    return all(c.passed for c in checks)


def format_checks(checks: Iterable[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"  [{c.verdict}] {c.number}. {c.name}: {c.detail}")
        if not c.passed:
            lines += [f"         - {e}" for e in c.examples]
    return "\n".join(lines)


# ---- I/O: read both stores directly (not through any service's API)


async def read_redis(redis: Any, event_id: str) -> tuple[Any, list[Holding]]:
    """(EventState or None, every issued record) from the event's Redis state."""
    from flashcoupon_common.event_state import iter_issued, read_state

    state = await read_state(redis, event_id)
    held = [Holding(c.user_id, c.seq, c.code, c.tier) async for c in iter_issued(redis, event_id)]
    return state, held


async def read_mysql(engine: Any, event_id: str) -> list[Holding]:
    from flashcoupon_common.db.schema import user_coupons as uc
    from sqlalchemy import select

    query = select(uc.c.user_id, uc.c.seq, uc.c.code, uc.c.tier).where(uc.c.event_id == event_id)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    return [Holding(r.user_id, int(r.seq), r.code, r.tier) for r in rows]


async def persisted_count(engine: Any, event_id: str) -> int:
    from flashcoupon_common.db.schema import user_coupons as uc
    from sqlalchemy import func, select

    async with engine.connect() as conn:
        query = select(func.count()).select_from(uc).where(uc.c.event_id == event_id)
        return int((await conn.execute(query)).scalar_one())


async def check_event(
    redis: Any,
    engine: Any,
    event_id: str,
    *,
    demand: int,
    answers: Sequence[tuple[str, str]],
    tier_quantities: Mapping[str, int] | None = None,
) -> list[Check]:
    """Every invariant for one event; tier totals from the spec when given, else Redis caps."""
    state, redis_held = await read_redis(redis, event_id)
    if state is None:
        return [Check(0, "event state in Redis", False, f"no Redis state for {event_id}")]
    mysql_held = await read_mysql(engine, event_id)
    return check_all(
        quantity=state.quantity,
        per_user_limit=state.per_user_limit,
        tier_quantities=tier_quantities or state.tier_quantities,
        issued_counter=state.issued,
        demand=demand,
        redis=redis_held,
        mysql=mysql_held,
        answers=answers,
    )
