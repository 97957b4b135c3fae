"""flashcoupon_common.aio.in_order: results in order, failures and cancellation as gather's."""

from __future__ import annotations

import asyncio
import gc

import pytest
from flashcoupon_common.aio import in_order


async def test_in_order_waits_for_every_call_in_order() -> None:
    loop = asyncio.get_running_loop()
    first, second = loop.create_future(), loop.create_future()
    loop.call_soon(second.set_result, "b")  # the second reply arriving first changes nothing
    loop.call_soon(first.set_result, "a")
    assert await in_order([first, second]) == ["a", "b"]


async def test_in_order_a_failed_call_cancels_the_others_and_retrieves_their_errors() -> None:
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, object]] = []
    # What earlier tests left behind (an aiokafka task of a closed loop, say) is collected
    # first, so only this test's futures can be reported below.
    gc.collect()
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))
    try:
        failed, pending, also_failed = (loop.create_future() for _ in range(3))
        failed.set_exception(ConnectionError("node down"))
        also_failed.set_exception(ConnectionError("node down too"))
        with pytest.raises(ConnectionError, match="node down"):
            await in_order([failed, pending, also_failed])
        assert pending.cancelled()  # the batcher then does not send it
        del failed, pending, also_failed
        gc.collect()  # an unretrieved error is reported when its future is collected
    finally:
        loop.set_exception_handler(handler)
    assert unretrieved == []


async def test_in_order_a_cancelled_press_cancels_its_calls() -> None:
    loop = asyncio.get_running_loop()
    calls = [loop.create_future(), loop.create_future()]
    waiting = asyncio.ensure_future(in_order(calls))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert all(c.cancelled() for c in calls)


async def test_in_order_runs_coroutines_at_once() -> None:
    # The issuer's presses of a batch must all reach the batcher before any is answered:
    # the first waits for something only the second does.
    second_ran = asyncio.Event()

    async def first() -> str:
        await second_ran.wait()
        return "first"

    async def second() -> str:
        second_ran.set()
        return "second"

    async with asyncio.timeout(5):  # one after another, the first would wait forever
        assert await in_order([first(), second()]) == ["first", "second"]
