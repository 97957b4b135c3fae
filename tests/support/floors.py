"""Benchmark floors (flashcoupon_loadtest.floor) under test: which presses took the ASGI call."""

from __future__ import annotations

from flashcoupon_common.http import Headers, Reply
from flashcoupon_loadtest.floor import Floor


def asgi_presses(floor: Floor) -> list[str]:
    """The events of the presses `floor` answers through its ASGI call from now on (its
    `press`); under uvicorn its direct answers leave this empty."""
    asked: list[str] = []
    press = floor.press

    async def counted(event_id: str, headers: Headers) -> Reply:
        asked.append(event_id)
        return await press(event_id, headers)

    floor.press = counted  # type: ignore[method-assign]
    return asked
