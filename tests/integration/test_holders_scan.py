"""scan_holders against the real Redis Cluster: every holder, whatever the page size.

The holders set decides who gets the edge's 410 after a sell-out; a holder missing from it
would be told SOLD_OUT instead of their coupon. The page is large (holders.SCAN_PAGE, so that
presses waiting on the load wait fewer round trips): a set larger than a page must still
come back whole, and one far smaller too.
"""

from __future__ import annotations

from flashcoupon_common import keys
from flashcoupon_common.holders import SCAN_PAGE, scan_holders

from tests.support.names import random_name


async def _holders(redis, n: int) -> tuple[str, set[str]]:
    """A new event whose users hash holds `n` shoppers (as issue.lua writes it); its id."""
    event_id = random_name("holders")
    users = sorted(f"shopper-{i}-é" for i in range(n))  # non-ASCII ids come back as they went
    for chunk in range(0, n, 5000):
        mapping = {u: f"CODE{i},1,0,rid" for i, u in enumerate(users[chunk : chunk + 5000])}
        await redis.hset(keys.users_key(event_id), mapping=mapping)
    return event_id, set(users)


async def test_every_holder_of_a_set_larger_than_a_page_is_read(redis_cluster) -> None:
    event_id, users = await _holders(redis_cluster, SCAN_PAGE * 2 + 123)
    try:
        assert await scan_holders(redis_cluster, event_id) == users
        assert await scan_holders(redis_cluster, event_id, count=1000) == users
    finally:
        await redis_cluster.delete(keys.users_key(event_id))


async def test_a_small_set_and_no_holders_at_all(redis_cluster) -> None:
    event_id, users = await _holders(redis_cluster, 3)
    try:
        assert await scan_holders(redis_cluster, event_id) == users
        assert await scan_holders(redis_cluster, random_name("nobody")) == frozenset()
    finally:
        await redis_cluster.delete(keys.users_key(event_id))
