"""The code permutation and tier draw: pure maths, checked without a server.

tests/integration/test_issuer_script.py checks the Lua script gives identical values.
"""

from __future__ import annotations

import random

import pytest
from flashcoupon_common.coupon_math import (
    CODE_DOMAIN,
    CROCKFORD,
    base32,
    code_prefix,
    coupon_code,
    feistel,
    feistel_inverse,
    pick_tier,
    tier_draw,
)


def test_feistel_is_a_bijection_on_samples() -> None:
    rng = random.Random(7)
    xs = [0, 1, 2, CODE_DOMAIN - 1, *(rng.randrange(CODE_DOMAIN) for _ in range(500))]
    ys = [feistel("k1", x) for x in xs]
    assert all(0 <= y < CODE_DOMAIN for y in ys)
    assert [feistel_inverse("k1", y) for y in ys] == xs
    assert len(set(ys)) == len(set(xs))


def test_codes_of_consecutive_sequence_numbers_are_unique_and_not_sequential() -> None:
    codes = [coupon_code("secret", s) for s in range(20_000)]
    assert len(set(codes)) == len(codes)
    assert all(len(c) == 14 and set(c) <= set(CROCKFORD) for c in codes)
    # keyed: another secret gives other codes; neighbours share no long common prefix
    assert coupon_code("other", 0) != codes[0]
    bodies = [c[4:] for c in codes[:100]]
    assert sorted(bodies) != bodies


def test_prefix_depends_on_secret_only() -> None:
    assert code_prefix("a") == coupon_code("a", 5)[:4]
    assert code_prefix("a") != code_prefix("b")


def test_base32_renders_fixed_width() -> None:
    assert base32(0, 4) == "0000"
    assert base32(31, 2) == "0Z"
    assert base32(CODE_DOMAIN - 1, 10) == "Z" * 10


def test_feistel_rejects_out_of_domain() -> None:
    with pytest.raises(ValueError):
        feistel("k", CODE_DOMAIN)


def test_draw_without_replacement_gives_exact_totals_in_random_order() -> None:
    caps = [100, 250, 650]
    issued = [0, 0, 0]
    order = []
    for seq in range(sum(caps)):
        remaining = [c - i for c, i in zip(caps, issued, strict=True)]
        k = pick_tier(tier_draw("s", seq), remaining)
        issued[k] += 1
        order.append(k)
    assert issued == caps
    # random order: the small tier is not all at the start or the end
    first_small = order.index(0)
    last_small = len(order) - 1 - order[::-1].index(0)
    assert first_small < 100 and last_small > 900


def test_pick_tier_skips_exhausted_tiers() -> None:
    for draw in range(50):
        assert pick_tier(draw, [0, 3, 0]) == 1
    with pytest.raises(ValueError):
        pick_tier(1, [0, 0])
