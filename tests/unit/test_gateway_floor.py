"""The gateway floor's reading of a token (the app itself, and its relayed answer: tests/e2e)."""

from __future__ import annotations

from flashcoupon_loadtest.gateway_floor import ISSUE_PREFIX, ISSUE_SUFFIX, subject
from flashcoupon_loadtest.tokens import DEMO_SECRET, TokenMinter


def test_the_subject_is_read_from_the_tokens_payload() -> None:
    minter = TokenMinter(DEMO_SECRET)
    for user in ("alice", "josé-X", "日本語-ユーザー", "u" * 128):
        assert subject(b"Bearer " + minter.mint(user).encode()) == user


def test_the_issue_route_is_the_gateways() -> None:
    assert (ISSUE_PREFIX, ISSUE_SUFFIX) == ("/v1/events/", "/issue")
