"""BoundedProbe: a readiness check that answers within its bound even when the check hangs."""

from __future__ import annotations

import asyncio

from flashcoupon_common.probes import BoundedProbe


class Gate:
    """A check that blocks until opened, counting how many times it was started."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.started = 0
        self.fail = False

    async def check(self) -> None:
        self.started += 1
        await self.opened.wait()
        if self.fail:
            raise ConnectionError("refused")


async def test_a_hung_check_is_answered_false_within_the_bound_and_never_piles_up() -> None:
    gate = Gate()
    probe = BoundedProbe(gate.check, timeout_s=0.05)
    async with asyncio.timeout(5):  # the probe, not this guard, must bound the wait
        assert [await probe.passes() for _ in range(3)] == [False, False, False]
    assert gate.started == 1  # later probes waited on the one stuck check
    gate.opened.set()
    await asyncio.sleep(0)
    assert await probe.passes() is True
    await probe.close()


async def test_a_failing_check_is_false_and_the_next_probe_checks_again() -> None:
    gate = Gate()
    gate.opened.set()
    gate.fail = True
    probe = BoundedProbe(gate.check, timeout_s=1)
    assert await probe.passes() is False
    gate.fail = False
    assert await probe.passes() is True
    assert gate.started == 2


async def test_close_cancels_a_pending_check() -> None:
    gate = Gate()
    probe = BoundedProbe(gate.check, timeout_s=0.05)
    assert await probe.passes() is False
    await probe.close()
    gate.opened.set()
    assert await probe.passes() is True
    assert gate.started == 2  # the cancelled check was not reused
