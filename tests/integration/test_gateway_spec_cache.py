"""The gateway's per-event state cache against the real Redis Cluster: read ahead of expiry.

An entry's age is set by moving its read time back, so no test sleeps or depends on timing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from flashcoupon_common import keys
from flashcoupon_gateway.admission import EventInfo, SpecCache
from flashcoupon_gateway.sold_out import SoldOutBoard
from redis.exceptions import ResponseError

from tests.support.names import random_name

TTL = 10.0  # read ahead from 5 s on


def answered_at_once(call: Coroutine[Any, Any, EventInfo]) -> EventInfo:
    """The value of `call` if it completes without suspending once (nobody waited on a read);
    fails otherwise."""
    try:
        call.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    call.close()
    raise AssertionError("the call waited")


def age(specs: SpecCache, event_id: str, seconds: float) -> float:
    """Make the event's entry `seconds` old; its new read time."""
    read_at = time.monotonic() - seconds
    specs._cache[event_id] = (read_at, specs._cache[event_id][1])
    return read_at


async def settle(specs: SpecCache) -> None:
    await asyncio.gather(*specs._refreshing)


async def read_ahead_by(specs: SpecCache, event_id: str, ask: Callable[[], object]) -> None:
    """Age the entry past half its life, `ask`, and check that one read ahead started and
    replaced the entry."""
    old = age(specs, event_id, TTL * 0.6)
    assert ask()
    assert len(specs._refreshing) == 1 and event_id in specs._pending
    await settle(specs)
    assert specs._cache[event_id][0] > old + TTL * 0.5


async def test_an_entry_is_read_again_before_it_expires_while_it_serves(redis_cluster) -> None:
    specs = SpecCache(redis_cluster, TTL, SoldOutBoard())
    event = random_name("ev")
    info = await specs.get(event)  # the first press waits for the first read
    assert info.spec is None  # not provisioned
    answered_at_once(specs.get(event))  # young: served, nothing read
    assert not specs._refreshing

    def press() -> bool:
        served = answered_at_once(specs.get(event)) is info  # past half its life: served...
        answered_at_once(specs.get(event))  # ...and one read at a time is started
        return served

    await read_ahead_by(specs, event, press)
    await specs.aclose()


async def test_the_sold_out_lanes_freshness_check_reads_ahead_too(redis_cluster) -> None:
    # After a sell-out the crowd is answered by the lane, which only asks `cached`: without
    # reading ahead there, the entry expired every ttl and a whole crowd waited on a read.
    specs = SpecCache(redis_cluster, TTL, SoldOutBoard())
    event = random_name("ev")
    await specs.get(event)
    await read_ahead_by(specs, event, lambda: specs.cached(event))
    await specs.aclose()


async def test_an_expired_entry_is_never_served(redis_cluster) -> None:
    specs = SpecCache(redis_cluster, TTL, SoldOutBoard())
    event = random_name("ev")
    await specs.get(event)
    old = age(specs, event, TTL + 1)
    call = specs.get(event)
    with pytest.raises(AssertionError, match="waited"):
        answered_at_once(call)  # the press waits for a read
    assert specs.cached(event) is None
    await specs.get(event)
    assert specs._cache[event][0] > old + TTL
    await specs.aclose()


async def test_a_read_begun_before_forget_is_not_cached(redis_cluster) -> None:
    # A supply change (SUPPLY_CHANNEL) during a read ahead: what that read saw may predate the
    # change, so it must not serve for another ttl; the next press reads again.
    specs = SpecCache(redis_cluster, TTL, SoldOutBoard())
    event = random_name("ev")
    await specs.get(event)
    age(specs, event, TTL * 0.6)
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
        age(specs, event, TTL * 0.6)
        assert answered_at_once(specs.get(event)) is info
        await settle(specs)  # the read ahead failed
        for _ in range(5):
            assert answered_at_once(specs.get(event)) is info
        assert not specs._refreshing and event not in specs._pending
        age(specs, event, TTL + 1)
        with pytest.raises(ResponseError):  # expired: the press reads, and fails, itself
            await specs.get(event)
    finally:
        await redis_cluster.delete(keys.config_key(event))
        await specs.aclose()
