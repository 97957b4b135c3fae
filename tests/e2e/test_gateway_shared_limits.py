"""Two gateway processes, one limit: the event cap and the per-user limit live in Redis Cluster,
so they hold across replicas."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from flashcoupon_common import keys
from flashcoupon_gateway.gcra import Limit
from flashcoupon_gateway.ratelimit import Check, user_key
from flashcoupon_loadtest.http1 import Connection, Target, build_request

from tests.support.gateway import bearer, provision, token
from tests.support.processes import Proc, gateway_proc, issuer_proc
from tests.support.stack import Stack

RATE = 100  # the event's admission cap, per second
WINDOW = 10.0


@pytest.fixture(scope="module")
def two_gateways(stack: Stack) -> Iterator[list[Proc]]:
    issuer = issuer_proc(stack).start()
    gateways = [gateway_proc(stack, issuer.url, event_shards="4") for _ in range(2)]
    try:
        for g in gateways:
            g.start()
        yield gateways
    finally:
        for p in [*gateways, issuer]:
            p.stop()


async def test_event_cap_holds_across_two_gateways(
    two_gateways: list[Proc], redis_cluster: Any
) -> None:
    spec = await provision(
        redis_cluster,
        quantity=100_000,
        max_per_second=RATE,
        per_user_per_second=1000,
        per_user_burst=1000,
    )
    path = f"/v1/events/{spec.event_id}/issue"
    targets = [Target.parse(g.url) for g in two_gateways]
    requests = {
        t.port: [
            build_request(t, "POST", path, {"Authorization": "Bearer " + token(f"u{i}")})
            for i in range(3000)
        ]
        for t in targets
    }
    admitted = {t.port: 0 for t in targets}
    limited = 0
    start = time.monotonic() + 0.5

    async def shopper(target: Target, offset: int) -> None:
        nonlocal limited
        conn = Connection(target)
        await conn.connect()
        pool = itertools.cycle(requests[target.port][offset::16])
        await asyncio.sleep(start - time.monotonic())
        while time.monotonic() < start + WINDOW:
            status, head, _ = await conn.request(next(pool))
            if time.monotonic() > start + WINDOW:
                break
            if status == 429:
                limited += 1
                assert b"retry-after" in head.lower()
            else:
                assert status in (201, 409), status
                admitted[target.port] += 1
        conn.close()

    await asyncio.gather(*(shopper(t, i) for t in targets for i in range(16)))
    total = sum(admitted.values())
    expected = RATE * WINDOW
    assert limited > total, "the offered load must exceed the cap for this test to mean much"
    assert all(n > 0.2 * total for n in admitted.values()), admitted  # both replicas admitted
    assert abs(total - expected) <= 0.05 * expected, (total, expected, admitted)


async def test_per_user_limit_holds_across_two_gateways(
    two_gateways: list[Proc], redis_cluster: Any
) -> None:
    spec = await provision(redis_cluster, per_user_per_second=2, per_user_burst=4)
    clients = [httpx.AsyncClient(base_url=g.url, timeout=10) for g in two_gateways]
    headers = bearer("greedy")
    admitted = limited = 0
    begin = time.monotonic()
    for i in range(60):
        r = await clients[i % 2].post(f"/v1/events/{spec.event_id}/issue", headers=headers)
        if r.status_code == 429:
            limited += 1
            assert r.json()["scope"] == "user" and int(r.headers["retry-after"]) >= 1
            assert r.headers["ratelimit-remaining"] == "0"
        else:
            assert r.status_code in (201, 409)
            admitted += 1
        await asyncio.sleep(max(0.0, begin + (i + 1) * 0.05 - time.monotonic()))
    elapsed = time.monotonic() - begin
    for c in clients:
        await c.aclose()
    # burst + rate x time, whichever replica answered
    assert 4 + 2 * elapsed - 2 <= admitted <= 4 + 2 * elapsed + 1, (admitted, elapsed)
    assert limited == 60 - admitted
    # Decided by the issue script (no waiting room, no event cap): the shopper's allowance is
    # in the event's slot, and the gateways' own limiter never held a key for them.
    assert await redis_cluster.hexists(keys.allowance_key(spec.event_id), "greedy")
    own = Check("user", user_key("greedy", f"ev:{spec.event_id}"), Limit(2, 4))
    assert not await redis_cluster.exists(own.key)


async def test_with_an_event_cap_the_gateway_decides_the_shoppers_limit_first(
    two_gateways: list[Proc], redis_cluster: Any
) -> None:
    """A press the shopper's limit refuses must not spend the event's admissions: with a cap,
    the gateway asks its limiter before the cap, and the issuer decides no allowance."""
    spec = await provision(
        redis_cluster, max_per_second=1000, per_user_per_second=1, per_user_burst=2
    )
    path = f"/v1/events/{spec.event_id}/issue"
    async with httpx.AsyncClient(base_url=two_gateways[0].url, timeout=10) as http:
        statuses = [(await http.post(path, headers=bearer("capped"))).status_code for _ in range(4)]
    assert statuses[:2] == [201, 409] and statuses[2:] == [429, 429], statuses
    own = Check("user", user_key("capped", f"ev:{spec.event_id}"), Limit(1, 2))
    assert await redis_cluster.exists(own.key)
    assert not await redis_cluster.exists(keys.allowance_key(spec.event_id))
