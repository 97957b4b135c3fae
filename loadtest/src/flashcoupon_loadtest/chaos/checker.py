"""The chaos checker: one row's answers and both stores' final contents → its figures.

Pure functions over plain data (the workload's `Answer`s, `Holding`s read from Redis and MySQL
after the drain, Redis counter samples), unit-tested with planted faults. Categories that fail
a row:

- **lost**: a 201 whose (user, coupon) has no MySQL row; a Redis issued record that never
  reached MySQL after the drain;
- **duplicated**: a code held twice or by two users, a user holding more than the limit, a
  shopper told two different codes;
- **oversold**: more coupons than the quantity, by the counter or by either store;
- **mismatch**: MySQL rows whose record Redis no longer holds (Redis forgot a coupon: a lost
  write on a crashed or demoted master) — invariant 4;
- **wrong answers**, by kind: `false_sold_out` (410 while a later counter sample shows supply
  left; the event is active for the whole run), `unrevealed_503` / `unrevealed_error` (a
  shopper answered 503, or not at all, before learning a coupon they hold, and whose later
  answers — their retries — never carried it),
  `other_5xx` (any 5xx but 503), `wrong_coupon` (a 409 DUPLICATE carrying a code the shopper
  does not hold), `unexpected_status` (anything
  else but 201/409/410/429 on an active, provisioned event — e.g. 404 after a shard lost
  its data).

A row may declare categories its setting documents as possible (durability `none` may lose
the last writes of a crashed master): those are reported, not failed.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flashcoupon_loadtest.chaos.workload import UNDECIDED, Answer
from flashcoupon_loadtest.invariants import Holding

# What a shopper pressing "get coupon" on an active, provisioned event may be answered.
EXPECTED = {0, 201, 409, 410, 429, 503}
EXPECTED_CODE = {409: "DUPLICATE", 410: "SOLD_OUT"}  # not NOT_STARTED, ENDED, ...
SLOW = 1.0
INSTANT_WINDOW = 5.0  # seconds: an answer slower than this is not "normal" for the recovery figure
CATEGORIES = ("lost", "duplicated", "oversold", "mismatch", "wrong")


@dataclass
class Figures:
    requests: int
    statuses: dict[str, int]
    acknowledged: int  # distinct coupons answered 201
    quantity: int
    issued: int  # the Redis counter after the drain
    redis_records: int
    mysql_rows: int
    lost: int
    duplicated: int
    oversold: int
    mismatch: int
    wrong: dict[str, int]
    p50_fault_ms: float | None
    p99_fault_ms: float | None
    p99_before_ms: float | None
    recovery_s: float | None  # fault end → last abnormal answer (None: not within the burst)
    caught_up_s: float | None  # fault end → MySQL within 1 s of Redis again (None: not seen)
    still_undecided: int  # shoppers still without a decision after the retries
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def wrong_total(self) -> int:
        return sum(self.wrong.values())

    def failures(self, allowed: Iterable[str] = ()) -> list[str]:
        counts = {
            "lost": self.lost,
            "duplicated": self.duplicated,
            "oversold": self.oversold,
            "mismatch": self.mismatch,
            "wrong": self.wrong_total,
        }
        return [c for c, n in counts.items() if n and c not in set(allowed)]

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "wrong_total": self.wrong_total}


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def false_sold_out(
    answers: Sequence[Answer], samples: Sequence[tuple[float, int]], quantity: int
) -> list[Answer]:
    """410s answered before a counter sample (taken later) that still showed supply.

    The counter only grows, so a sample below the quantity taken after the 410 was answered
    proves supply remained when it was given. Samples after the counter went backwards (a
    master lost writes) prove nothing and are ignored.
    """
    trusted: list[tuple[float, int]] = []
    high = -1
    for t, issued in sorted(samples):
        if issued < high:
            break
        high = issued
        trusted.append((t, issued))
    last_below = max((t for t, issued in trusted if issued < quantity), default=None)
    if last_below is None:
        return []
    return [
        a for a in answers if a.status == 410 and a.code == "SOLD_OUT" and a.answered < last_below
    ]


def caught_up(
    issued: Sequence[tuple[float, int]], persisted: Sequence[tuple[float, int]], end: float
) -> float | None:
    """Seconds from the fault's end until MySQL held what Redis had issued a second earlier."""
    issued = sorted(issued)
    for t, rows in sorted(persisted):
        if t < end:
            continue
        earlier = [n for s, n in issued if s <= t - 1.0]
        if earlier and rows >= earlier[-1]:
            return round(t - end, 2)
    return None


def judge(
    answers: Sequence[Answer],
    *,
    redis: Sequence[Holding],
    mysql: Sequence[Holding],
    issued: int,
    quantity: int,
    per_user_limit: int,
    samples: Sequence[tuple[float, int]],
    fault: tuple[float, float],
    persisted: Sequence[tuple[float, int]] = (),
) -> Figures:
    ex: dict[str, list[str]] = defaultdict(list)

    def note(kind: str, what: object) -> None:
        if len(ex[kind]) < 5:
            ex[kind].append(str(what))

    mysql_by_code = {h.code: h for h in mysql}
    redis_by_code = {h.code: h for h in redis}
    held: dict[str, set[str]] = defaultdict(set)  # user → codes, either store
    for h in [*redis, *mysql]:
        held[h.user].add(h.code)

    # lost: acknowledged coupons without their row; issued records that never arrived
    acked = {(a.user, a.coupon) for a in answers if a.status == 201 and a.coupon}
    lost_acked = sorted(
        (u, c) for u, c in acked if c not in mysql_by_code or mysql_by_code[c].user != u
    )
    for u, c in lost_acked:
        note("lost", f"{u} was answered 201 {c}; MySQL has {mysql_by_code.get(c)}")
    told = {c for _, c in lost_acked}
    pipeline = [h for c, h in redis_by_code.items() if c not in mysql_by_code and c not in told]
    for h in pipeline:
        note("lost", f"in Redis, never reached MySQL: {h}")

    # duplicated
    dup = 0
    for store, rows in (("redis", redis), ("mysql", mysql)):
        for code, n in Counter(h.code for h in rows).items():
            if n > 1:
                dup += n - 1
                note("duplicated", f"{store}: code {code} × {n}")
        for user, n in Counter(h.user for h in rows).items():
            if n > per_user_limit:
                dup += n - per_user_limit
                note("duplicated", f"{store}: {user} holds {n}")
    for code, h in mysql_by_code.items():
        if code in redis_by_code and redis_by_code[code].user != h.user:
            dup += 1
            note("duplicated", f"code {code}: redis {redis_by_code[code].user}, mysql {h.user}")
    told_codes: dict[str, set[str]] = defaultdict(set)
    for a in answers:
        if a.coupon and a.status in (201, 409):
            told_codes[a.user].add(a.coupon)
    for user, codes in told_codes.items():
        if len(codes) > per_user_limit:
            dup += len(codes) - per_user_limit
            note("duplicated", f"{user} was told {sorted(codes)}")

    oversold = max(0, issued - quantity, len(redis) - quantity, len(mysql) - quantity)
    forgot = [h for c, h in mysql_by_code.items() if c not in redis_by_code]
    for h in forgot:
        note("mismatch", f"in MySQL, no longer in Redis: {h}")

    # wrong answers
    wrong: Counter[str] = Counter()
    for a in false_sold_out(answers, samples, quantity):
        wrong["false_sold_out"] += 1
        note("false_sold_out", a)
    for a in answers:
        if a.status >= 500 and a.status != 503:
            wrong["other_5xx"] += 1
            note("other_5xx", a)
        elif a.status not in EXPECTED or EXPECTED_CODE.get(a.status, a.code) != a.code:
            wrong["unexpected_status"] += 1
            note("unexpected_status", a)
        # A 201 whose coupon the shopper does not hold is *lost* (counted there, whoever
        # holds the code now: a master that lost the write lets the script issue it again);
        # a 409 DUPLICATE is an answer about holdings, wrong when they are not the shopper's.
        if a.coupon and a.status == 409 and a.coupon not in held[a.user]:
            owner = mysql_by_code.get(a.coupon) or redis_by_code.get(a.coupon)
            wrong["wrong_coupon"] += 1
            note("wrong_coupon", f"{a} (held by {owner})")
    by_user: dict[str, list[Answer]] = defaultdict(list)
    for a in answers:
        by_user[a.user].append(a)
    still = 0
    for user, mine in by_user.items():
        mine.sort(key=lambda a: a.sent)
        final = mine[-1]
        still += final.status in UNDECIDED
        if not held[user]:
            continue
        # The first 503 (or missing answer) of a shopper who had not yet been told a coupon
        # they hold: some later answer (their retries) must carry it. A holder who already
        # got their 201 and is then answered 503 on a second press knows their coupon.
        knew = False
        for k, a in enumerate(mine):
            if a.status in (0, 503) and not knew:
                if not any(b.coupon in held[user] for b in mine[k + 1 :]):
                    kind = "unrevealed_503" if a.status == 503 else "unrevealed_error"
                    wrong[kind] += 1
                    seen = [(b.status, b.code, b.coupon) for b in mine]
                    note(kind, f"{user} holds {sorted(held[user])}; answers {seen}")
                break
            knew = knew or a.coupon in held[user]

    # latency and recovery (burst answers only: retries are the harness's, not the crowd's)
    start, end = fault
    burst = [a for a in answers if a.phase == "burst"]
    # An instant fault (a kill nobody undoes) is measured over the 5 s that follow it.
    window = max(end, start + INSTANT_WINDOW)
    during = [a.latency for a in burst if start <= a.sent <= window]
    before = [a.latency for a in burst if a.sent < start]

    def normal(a: Answer) -> bool:
        return a.status not in UNDECIDED and a.latency < SLOW

    after = sorted((a for a in burst if a.sent >= end), key=lambda a: a.sent)
    abnormal = [a.answered for a in after if not normal(a)]
    recovery: float | None = max(0.0, max(abnormal, default=end) - end)
    if after and not normal(after[-1]):
        recovery = None

    return Figures(
        requests=len(answers),
        statuses=dict(sorted(Counter(str(a.status) for a in answers).items())),
        acknowledged=len({c for _, c in acked}),
        quantity=quantity,
        issued=issued,
        redis_records=len(redis),
        mysql_rows=len(mysql),
        lost=len(lost_acked) + len(pipeline),
        duplicated=dup,
        oversold=oversold,
        mismatch=len(forgot),
        wrong=dict(wrong),
        p50_fault_ms=_ms(percentile(during, 0.50)),
        p99_fault_ms=_ms(percentile(during, 0.99)),
        p99_before_ms=_ms(percentile(before, 0.99)),
        recovery_s=None if recovery is None else round(recovery, 2),
        caught_up_s=caught_up(samples, persisted, end),
        still_undecided=still,
        examples=dict(ex),
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)
