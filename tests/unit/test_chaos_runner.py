"""A chaos row that stops making progress is reported as stuck, with its stacks, and the run
goes on (loadtest/.../chaos/runner.py): one hung harness call must not eat the test tier's
whole deadline, as a hung row once did in CI (900 s, nothing printed)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from flashcoupon_loadtest.chaos.faults import FAULTS, Timing
from flashcoupon_loadtest.chaos.runner import RowResult, run_row


class HungStack:
    """A private stack whose status check never returns until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def healthy(self) -> tuple[bool, str]:
        self.release.wait(30)
        return True, ""


def test_a_row_past_its_deadline_is_reported_stuck_with_its_stacks(tmp_path: Path) -> None:
    stack = HungStack()

    async def scenario() -> RowResult:
        try:
            return await run_row(
                stack,  # type: ignore[arg-type]
                FAULTS["relay-kill-survivor"],
                Timing.short(),
                tmp_path,
                budget=0.5,
            )
        finally:
            stack.release.set()

    result = asyncio.run(scenario())
    assert result.verdict == "FAIL"
    assert result.error is not None and result.error.startswith("stuck in heal the stack")
    stuck = (tmp_path / "relay-kill-survivor" / "stuck.txt").read_text()
    assert stuck.startswith("stuck in: heal the stack")
    assert "in healthy" in stuck  # the thread's frame: where it hung


def test_a_rows_deadline_covers_its_own_timeline() -> None:
    short = Timing.short()
    hold = FAULTS["gateway-redis-freeze"].hold_seconds(short)
    timeline = short.warm + hold + short.after + short.retry + short.drain
    assert short.row_budget(hold) > timeline + 120
