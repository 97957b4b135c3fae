"""What the benchmarks' floors share: an ASGI app that serves one issue route and nothing else.

A floor (flashcoupon_loadtest.issuer_floor, flashcoupon_loadtest.gateway_floor) answers a
service's presses with only what every such service needs, so a benchmark can tell the
service's own rules from what the architecture allows. This base does the ASGI part: the
lifespan starts and stops the floor's clients, a POST to `<prefix><eventId><suffix>` is the
floor's `press`, and anything else (the benchmarks' /readyz) is 200.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from flashcoupon_common.http import JSON_HEADERS, Headers, Reply
from starlette.types import Receive, Scope, Send


class Floor(ABC):
    def __init__(self, prefix: str, suffix: str) -> None:
        self._prefix = prefix
        self._suffix = suffix
        self._started = False

    @abstractmethod
    async def start(self) -> None:
        """Open the clients the presses use (the lifespan's startup)."""

    @abstractmethod
    async def stop(self) -> None:
        """Close them (the lifespan's shutdown)."""

    @abstractmethod
    async def press(self, event_id: str, headers: Headers) -> Reply:
        """The answer to one press of `event_id`, from the request's raw headers."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        event_id = self.pressed_event(scope)
        if event_id is not None:
            reply = await self.press(event_id, scope["headers"])
        else:
            reply = Reply.of(200, JSON_HEADERS, b'"ok"')  # /readyz: the server is up
        await reply.send(send)

    def pressed_event(self, scope: Scope) -> str | None:
        """The event id of a press to the floor's route once started, else None."""
        path: str = scope["path"]
        if self._started and path.startswith(self._prefix) and path.endswith(self._suffix):
            return path[len(self._prefix) : -len(self._suffix)]
        return None

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.start()
                self._started = True
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self._started = False
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return
