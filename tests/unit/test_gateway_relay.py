"""What the shopper gets of an upstream's answer: the headers worth passing, as sent, with the
gateway's RateLimit-* headers and a Content-Length (upstream.answer_of, routes.relay)."""

from __future__ import annotations

import pytest
from flashcoupon_common.http import ProblemError
from flashcoupon_gateway import gcra
from flashcoupon_gateway.breaker import Breaker
from flashcoupon_gateway.ratelimit import Check, Outcome, rate_headers
from flashcoupon_gateway.routes import relay
from flashcoupon_gateway.upstream import Upstream, answer_of

ISSUER = Upstream("issuer", "http://127.0.0.1:1", Breaker(1, 30.0), 1)
BODY = b'{"couponCode":"FC1"}'


def test_a_relayed_answer_keeps_the_passed_headers_as_sent_and_states_its_length() -> None:
    answer = answer_of(
        ISSUER,
        "POST",
        "/x",
        201,
        [
            (b"content-type", b"application/json"),
            (b"date", b"Sat, 28 Nov 2026 15:00:00 GMT"),  # the issuer's own: not passed
            (b"idempotent-replayed", b"true"),
            (b"x-flashcoupon-allowance", b"2 500000 0"),  # read, never relayed
        ],
        BODY,
    )
    assert answer.allowance == (2, 500_000, 0)
    assert answer.header(b"idempotent-replayed") == "true" and answer.header(b"date") is None
    user = Check("user", "{rl:u:ann}:ev:e", gcra.limit(0.5, 3))
    reply = relay(answer, rate_headers([Outcome(user, True, 0, 2, 1_500_000)]))
    assert (reply.status, reply.body) == (201, BODY)
    assert reply.headers == [
        (b"content-type", b"application/json"),
        (b"idempotent-replayed", b"true"),
        (b"ratelimit-limit", b"3"),
        (b"ratelimit-remaining", b"2"),
        (b"ratelimit-reset", b"2"),
        (b"ratelimit-policy", b"3;w=6"),
        (b"content-length", b"20"),
    ]


def test_an_error_answer_that_is_not_our_json_is_a_bad_upstream() -> None:
    with pytest.raises(ProblemError) as refused:
        answer_of(ISSUER, "POST", "/x", 400, [(b"content-type", b"text/plain")], b"Bad")
    assert (refused.value.status, refused.value.code) == (502, "BAD_UPSTREAM")
    problem = [(b"content-type", b"application/problem+json")]
    assert answer_of(ISSUER, "POST", "/x", 410, problem, b"{}").status == 410
