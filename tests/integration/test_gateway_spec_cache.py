"""The gateway's per-event state cache against the real Redis Cluster: read ahead of expiry."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
from flashcoupon_common import keys
from flashcoupon_gateway.admission import EventInfo, SpecCache
from flashcoupon_gateway.sold_out import SoldOutBoard
from redis.exceptions import ResponseError

from tests.support.names import random_name

TTL = 0.4  # read again after 0.2 s


def answered_at_once(call: Coroutine[Any, Any, EventInfo]) -> EventInfo:
    """The value of `call` if it completes without suspending once (nobody waited on a read);
    fails otherwise."""
    try:
        call.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    call.close()
    raise AssertionError("the call waited")


def read_at(specs: SpecCache, event_id: str) -> float:
    return specs._cache[event_id][0]


async def settle(specs: SpecCache) -> None:
    await asyncio.gather(*specs._refreshing)


async def test_an_entry_is_read_again_before_it_expires_while_it_serves(redis_cluster) -> None:
    specs = SpecCache(redis_cluster, TTL, SoldOutBoard())
    event = random_name("ev")
    info = await specs.get(event)  # the first press waits for the first read
    assert info.spec is None  # not provisioned
    first = read_at(specs, event)

    answered_at_once(specs.get(event))  # young: served, nothing read
    assert not specs._refreshing

    await asyncio.sleep(TTL / 2 + 0.05)
    assert answered_at_once(specs.get(event)) is info  # past half its life: still served...
    assert len(specs._refreshing) == 1 and event in specs._pending  # ...and read in the back
    answered_at_once(specs.get(event))  # one read at a time
    assert len(specs._refreshing) == 1
    await settle(specs)
    assert read_at(specs, event) > first
    await specs.aclose()


async def test_the_sold_out_lanes_freshness_check_reads_ahead_too(redis_cluster) -> None:
    # After a sell-out the crowd is answered by the lane, which only asks `fresh`: without
    # reading ahead there, the entry expired every ttl and a whole crowd waited on a read.
    specs = SpecCache(redis_cluster, TTL, SoldOutBoard())
    event = random_name("ev")
    await specs.get(event)
    first = read_at(specs, event)
    await asyncio.sleep(TTL / 2 + 0.05)
    assert specs.fresh(event)
    await settle(specs)
    assert read_at(specs, event) > first
    await asyncio.sleep(TTL / 2 + 0.05)
    assert specs.fresh(event)  # still fresh: the lane never stopped
    await settle(specs)
    await specs.aclose()


async def test_an_expired_entry_is_never_served(redis_cluster) -> None:
    specs = SpecCache(redis_cluster, TTL, SoldOutBoard())
    event = random_name("ev")
    await specs.get(event)
    first = read_at(specs, event)
    await asyncio.sleep(TTL + 0.05)  # nobody asked in between: nothing was read ahead
    assert not specs.fresh(event)
    await settle(specs)  # the check above started a read; the press below may share it
    await specs.get(event)
    assert read_at(specs, event) > first + TTL
    await specs.aclose()


async def test_a_read_begun_before_forget_is_not_cached(redis_cluster) -> None:
    # A supply change (SUPPLY_CHANNEL) during a read ahead: what that read saw may predate the
    # change, so it must not serve for another ttl; the next press reads again.
    specs = SpecCache(redis_cluster, TTL, SoldOutBoard())
    event = random_name("ev")
    await specs.get(event)
    await asyncio.sleep(TTL / 2 + 0.05)
    answered_at_once(specs.get(event))  # starts the read ahead
    specs.forget(event)
    await settle(specs)
    assert event not in specs._cache
    await specs.get(event)
    assert event in specs._cache
    await specs.aclose()


async def test_a_failed_read_ahead_is_not_repeated_for_the_same_entry(redis_cluster) -> None:
    # A read that fails (here WRONGTYPE; Redis unreachable alike): the entry still serves until
    # it expires, and one failed read ahead does not become one more failing read, and one
    # more warning, per press meanwhile.
    specs = SpecCache(redis_cluster, TTL, SoldOutBoard())
    event = random_name("ev")
    info = await specs.get(event)
    await redis_cluster.set(keys.config_key(event), "not a hash")  # every read now fails
    try:
        await asyncio.sleep(TTL / 2 + 0.05)
        assert answered_at_once(specs.get(event)) is info
        await settle(specs)  # the read ahead failed
        for _ in range(5):
            assert answered_at_once(specs.get(event)) is info
        assert not specs._refreshing and event not in specs._pending
        await asyncio.sleep(TTL / 2)
        with pytest.raises(ResponseError):  # expired: the press reads, and fails, itself
            await specs.get(event)
    finally:
        await redis_cluster.delete(keys.config_key(event))
        await specs.aclose()
