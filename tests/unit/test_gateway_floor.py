"""The gateway floor's reading of a token and its relayed headers (the app itself: tests/e2e)."""

from __future__ import annotations

from flashcoupon_gateway.upstream import Answer
from flashcoupon_loadtest.gateway_floor import ISSUE_PREFIX, ISSUE_SUFFIX, response_headers, subject
from flashcoupon_loadtest.tokens import DEMO_SECRET, TokenMinter


def test_the_subject_is_read_from_the_tokens_payload() -> None:
    minter = TokenMinter(DEMO_SECRET)
    for user in ("alice", "josé-X", "日本語-ユーザー", "u" * 128):
        assert subject(b"Bearer " + minter.mint(user).encode()) == user


def test_the_relayed_answer_keeps_its_headers_and_states_its_length() -> None:
    answer = Answer(201, b'{"couponCode":"FC1"}', {"content-type": "application/json",
                                                   "idempotent-replayed": "true"})  # fmt: skip
    assert response_headers(answer) == [
        (b"content-type", b"application/json"),
        (b"idempotent-replayed", b"true"),
        (b"content-length", b"20"),
    ]


def test_the_issue_route_is_the_gateways() -> None:
    assert (ISSUE_PREFIX, ISSUE_SUFFIX) == ("/v1/events/", "/issue")
