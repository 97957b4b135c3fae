"""The issuer floor's answer to an issue.lua reply (the app itself: tests/integration)."""

from __future__ import annotations

import orjson
from flashcoupon_loadtest.issuer_floor import answer

ISSUED = [b"ISSUED", 9, 0, 1, b"FC7ABCDEFGHJK", b"big", b"fixed", b"10000", b"", b"",
          b"1764300000123", b"1764386400123"]  # fmt: skip


def test_an_issued_reply_is_a_201_with_its_coupon() -> None:
    status, body = answer("ev-1", "alice", ISSUED)
    assert status == 201
    assert orjson.loads(body) == {
        "eventId": "ev-1",
        "userId": "alice",
        "couponCode": "FC7ABCDEFGHJK",
        "tier": "big",
        "discount": {"type": "fixed"},
        "issuedAt": 1764300000123,
        "expiresAt": 1764386400123,
    }


def test_any_other_reply_is_a_409_naming_the_scripts_status() -> None:
    assert answer("ev-1", "alice", [b"SOLD_OUT", 0, 0, 0]) == (409, b'{"code":"SOLD_OUT"}')
    held = [b"DUPLICATE", -1, 0, 1, *ISSUED[4:]]
    assert answer("ev-1", "alice", held) == (409, b'{"code":"DUPLICATE"}')
