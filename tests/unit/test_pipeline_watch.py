"""The demo's background pipeline watch stops even when a sample swallows its cancellation."""

from __future__ import annotations

import asyncio

from flashcoupon_loadtest.drop import PipelineWatch


class _Swallowing(PipelineWatch):
    """Samples whose driver cleanup swallows a cancellation, as SQLAlchemy's connection close
    can when the cancel lands in it."""

    def __init__(self) -> None:
        super().__init__(None, None, "ev", interval=0.01)
        self.inside = asyncio.Event()

    async def sample(self) -> tuple[float, int, int]:
        self.inside.set()
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            pass
        return 0.0, 0, 0


def test_stop_ends_the_watch_even_if_a_sample_swallows_the_cancel() -> None:
    async def scenario() -> None:
        watch = _Swallowing()
        watch.start()
        await watch.inside.wait()  # the cancel lands inside a sample
        await asyncio.wait_for(watch.stop(), 2.0)  # hung forever before

    asyncio.run(scenario())
