"""A rollout: gateways newer than the issuers behind them.

An issuer older than the shopper's allowance in the issue call (or one with it switched off,
FLASHCOUPON_ISSUER_DECIDE_ALLOWANCE=false, which answers the same way) refuses a batch whose
presses carry it and ignores the lone press's header. The gateway must still enforce the
shopper's limit, deciding it itself, and no shopper may see the refusal."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from flashcoupon_common import keys
from flashcoupon_gateway.gcra import Limit
from flashcoupon_gateway.ratelimit import Check, user_key

from tests.support.gateway import bearer, provision
from tests.support.processes import Proc, gateway_proc, issuer_proc
from tests.support.stack import Stack


@pytest.fixture(scope="module")
def older_issuer(stack: Stack) -> Iterator[Proc]:
    issuer = issuer_proc(stack, decide_allowance="false").start()
    try:
        yield issuer
    finally:
        issuer.stop()


@pytest.mark.parametrize("batch_max", ["256", "0"], ids=["batched", "unbatched"])
async def test_the_shoppers_limit_holds_behind_an_issuer_without_allowances(
    stack: Stack, older_issuer: Proc, redis_cluster: Any, batch_max: str
) -> None:
    spec = await provision(redis_cluster, per_user_per_second=1, per_user_burst=2)
    path = f"/v1/events/{spec.event_id}/issue"
    gateway = gateway_proc(stack, older_issuer.url, issue_batch_max=batch_max).start()
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
            # A crowd's first presses: whatever the issuer refuses is sent again.
            crowd = await asyncio.gather(
                *(http.post(path, headers=bearer(f"shopper-{i}")) for i in range(20))
            )
            assert [r.status_code for r in crowd] == [201] * 20, [r.text for r in crowd]
            greedy = [(await http.post(path, headers=bearer("greedy"))) for _ in range(4)]
    finally:
        gateway.stop()
    assert [r.status_code for r in greedy] == [201, 409, 429, 429], [r.text for r in greedy]
    assert greedy[2].json()["scope"] == "user" and "ratelimit-remaining" in greedy[2].headers
    # Decided by the gateway's own limiter; the issuer kept no allowance.
    own = Check("user", user_key("greedy", f"ev:{spec.event_id}"), Limit(1, 2))
    assert await redis_cluster.exists(own.key)
    assert not await redis_cluster.exists(keys.allowance_key(spec.event_id))
    assert "decided by the gateway" in gateway.output()
