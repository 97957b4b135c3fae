"""Issue requests go to the issuer the shopper hashes to, the same from every gateway replica."""

from __future__ import annotations

import time

from flashcoupon_gateway.upstream import Forwarder, issuer_index

URLS = ("http://127.0.0.1:1", "http://127.0.0.1:2")


def forwarder() -> Forwarder:
    return Forwarder(
        URLS,
        "http://127.0.0.1:3",
        connections=1,
        timeout_seconds=1.0,
        failure_threshold=1,
        open_seconds=30.0,
    )


def test_a_user_reaches_the_same_issuer_from_every_gateway() -> None:
    a, b = forwarder(), forwarder()  # two gateway replicas
    for user in (f"u{i}" for i in range(200)):
        picks = {a.pick_issuer(affinity=user).base_url for _ in range(3)}
        picks |= {b.pick_issuer(affinity=user).base_url}
        assert picks == {URLS[issuer_index(user, 2)]}


def test_users_spread_over_the_issuers() -> None:
    counts = [0, 0]
    for i in range(10_000):
        counts[issuer_index(f"user-{i}", 2)] += 1
    assert min(counts) > 4_500


def test_a_user_whose_issuer_is_open_fails_over_and_unkeyed_reads_rotate() -> None:
    f = forwarder()
    user = next(u for u in (f"u{i}" for i in range(100)) if issuer_index(u, 2) == 0)
    f.issuers[0].breaker.on_failure(time.monotonic())  # threshold 1: now open
    assert f.pick_issuer(affinity=user).base_url == URLS[1]
    assert {f.pick_issuer().base_url for _ in range(4)} == {URLS[1]}
    g = forwarder()
    assert {g.pick_issuer().base_url for _ in range(4)} == set(URLS)
