"""flashcoupon_common.holders: who may be answered SOLD_OUT from a cache."""

from __future__ import annotations

import asyncio

from flashcoupon_common.holders import Holders, holds_nothing


def test_only_known_non_holders_hold_nothing() -> None:
    assert holds_nothing(frozenset({"a"}), "b")
    assert not holds_nothing(frozenset({"a"}), "a")
    assert not holds_nothing(None, "b")  # unknown: ask the script


def test_concurrent_requests_share_one_load() -> None:
    loads = 0

    async def scenario() -> None:
        opened = asyncio.Event()

        async def load(event_id: str) -> frozenset[str]:
            nonlocal loads
            loads += 1
            await opened.wait()
            return frozenset({"a"})

        h = Holders(load, timeout=60)
        waiting = [asyncio.create_task(h.holds_nothing("ev", u)) for u in ("a", "b", "c")]
        await asyncio.sleep(0)
        opened.set()
        assert await asyncio.gather(*waiting) == [False, True, True]
        assert h.cached("ev") == frozenset({"a"}) and loads == 1

    asyncio.run(scenario())


def test_a_set_loaded_across_a_supply_change_is_not_kept() -> None:
    async def scenario() -> None:
        opened = asyncio.Event()

        async def load(event_id: str) -> frozenset[str]:
            await opened.wait()
            return frozenset({"old"})

        h = Holders(load, timeout=60)
        task = asyncio.create_task(h.get("ev"))
        await asyncio.sleep(0)
        h.forget("ev")  # supply raised while the scan ran
        opened.set()
        assert await task == frozenset({"old"})
        assert h.cached("ev") is None

    asyncio.run(scenario())


def test_a_failed_load_is_unknown_and_retried() -> None:
    answers: list[object] = [ConnectionError("away"), frozenset({"a"})]

    async def load(event_id: str) -> frozenset[str]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, frozenset)
        return answer

    async def scenario() -> None:
        h = Holders(load)
        assert not await h.holds_nothing("ev", "b")
        assert await h.holds_nothing("ev", "b")

    asyncio.run(scenario())
