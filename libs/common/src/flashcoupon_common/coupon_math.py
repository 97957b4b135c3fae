"""The pure maths of issuance, shared by the Lua script (issue.lua) and Python.

Nothing is pre-generated: a coupon's code and tier are derived at issue time from the event's
sequence number and a per-event secret, so 10 M coupons cost no memory until issued.

* **Code**: a keyed 4-round Feistel permutation over [0, 2^50) maps the sequence number to a
  50-bit value, rendered as 10 Crockford base32 characters after a 4-character per-event prefix.
  A permutation of distinct sequence numbers gives distinct codes (uniqueness is guaranteed, not
  probabilistic); without the secret the valid codes are a 1-in-10^8 sparse set of the 2^50
  space for a 10 M event (unguessable). The round function is SHA-1 of `secret:round:half`,
  because `redis.sha1hex` is the only keyed-hash primitive inside Redis Lua.
* **Tier**: drawn without replacement — a keyed pseudo-random r < remaining walks the tiers'
  remaining counts. Per-tier totals are exact by construction (a tier with nothing left cannot
  be drawn) and the order among winners is random. Raising the quantity just raises the caps.

The subtle part: Lua numbers are doubles, so every intermediate value stays below 2^53 and the
SHA-1 hex is cut to 7 (round function) or 12 (tier draw) digits. The Python here is the
reference; tests/unit/test_permutation*.py check the script produces identical values.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

HALF_BITS = 25
HALF = 1 << HALF_BITS
CODE_DOMAIN = HALF * HALF  # 2^50
ROUNDS = 4
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
PREFIX_LEN = 4
BODY_LEN = 10  # 50 bits / 5 bits per character


def _round(secret: str, rnd: int, half: int) -> int:
    digest = hashlib.sha1(f"{secret}:{rnd}:{half}".encode()).hexdigest()
    return int(digest[:7], 16) & (HALF - 1)


def feistel(secret: str, x: int) -> int:
    """The keyed permutation of [0, 2^50) that turns a sequence number into a code body."""
    if not 0 <= x < CODE_DOMAIN:
        raise ValueError(f"{x} outside the code domain")
    left, right = divmod(x, HALF)
    for rnd in range(1, ROUNDS + 1):
        left, right = right, left ^ _round(secret, rnd, right)
    return left * HALF + right


def feistel_inverse(secret: str, y: int) -> int:
    """Code body → sequence number (support tooling; the hot path never needs it)."""
    left, right = divmod(y, HALF)
    for rnd in range(ROUNDS, 0, -1):
        left, right = right ^ _round(secret, rnd, left), left
    return left * HALF + right


def base32(value: int, width: int) -> str:
    out = []
    for _ in range(width):
        value, digit = divmod(value, 32)
        out.append(CROCKFORD[digit])
    return "".join(reversed(out))


def code_prefix(secret: str) -> str:
    """The event's 4-character code prefix: keeps codes of different events apart."""
    return base32(int(hashlib.sha1(f"{secret}:prefix".encode()).hexdigest()[:5], 16), PREFIX_LEN)


def coupon_code(secret: str, seq: int) -> str:
    """The code of the event's seq-th coupon (seq counts from 0, across quantity raises)."""
    return code_prefix(secret) + base32(feistel(secret, seq), BODY_LEN)


def tier_draw(secret: str, seq: int) -> int:
    """The keyed pseudo-random number (< 2^48) the seq-th issue uses to draw its tier.

    48 bits, not more: the script computes `draw % remaining` in doubles, which stays exact
    only while draw / remaining keeps a fractional resolution finer than 1 / remaining.
    """
    return int(hashlib.sha1(f"{secret}:t:{seq}".encode()).hexdigest()[:12], 16)


def pick_tier(draw: int, remaining: Sequence[int]) -> int:
    """Index of the tier the draw falls into, weighting tiers by what they have left."""
    total = sum(remaining)
    if total <= 0:
        raise ValueError("nothing left to draw from")
    r = draw % total
    for index, left in enumerate(remaining):
        if r < left:
            return index
        r -= left
    raise AssertionError("unreachable: r < total")


def tier_caps(targets: Sequence[int], issued: Sequence[int], quantity: int) -> list[int]:
    """Per-tier caps for a (re-)provision: the targets, adjusted so no cap is below issued.

    `targets` come from EventSpec.tier_quantities(quantity). On a raise each target normally
    grows, but the largest-remainder split can shrink a tier by one (the Alabama paradox); if
    that tier already issued its old cap, its cap stays at issued and the surplus comes off the
    tier with the most room, so the caps still sum to `quantity`. Raises ValueError if the
    quantity is below what was issued.
    """
    if sum(issued) > quantity:
        raise ValueError(f"quantity {quantity} is below the {sum(issued)} coupons already issued")
    caps = [max(t, i) for t, i in zip(targets, issued, strict=True)]
    excess = sum(caps) - quantity
    while excess > 0:
        room = [c - i for c, i in zip(caps, issued, strict=True)]
        k = max(range(len(caps)), key=lambda j: (room[j], -j))
        caps[k] -= 1
        excess -= 1
    return caps


def phase(
    now_ms: int,
    *,
    start_ms: int,
    end_ms: int,
    remaining: int,
) -> str:
    """The event's phase as the CouponEvent status shows it.

    Paused is not a phase (docs/couponctl.md): a paused Active event is still Active, and
    `paused` is reported beside the phase.
    """
    if now_ms >= end_ms:
        return "Ended"
    if now_ms < start_ms:
        return "Ready"
    if remaining <= 0:
        return "SoldOut"
    return "Active"


def window_status(now_ms: int, start_ms: int, end_ms: int) -> str | None:
    """NOT_STARTED / ENDED, or None when the window is open (mirrors the script's check)."""
    if now_ms < start_ms:
        return "NOT_STARTED"
    if now_ms >= end_ms:
        return "ENDED"
    return None


def remaining_by_tier(caps: Mapping[str, int], issued: Mapping[str, int]) -> dict[str, int]:
    return {name: caps[name] - issued.get(name, 0) for name in caps}
