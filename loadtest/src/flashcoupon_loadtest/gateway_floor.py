"""The gateway's floor: a press forwarded with nothing but what every gateway on this stack needs.

An ASGI app, a benchmark baseline like the issuer's floor (flashcoupon_loadtest.issuer_floor),
not a service: it takes the shopper from the bearer token's `sub` without verifying the token,
hands the press to the gateway's own batcher (flashcoupon_gateway.issue_batch: the presses of
a loop turn in one issue-batch request to the issuer, over the gateway's pooled keep-alive
connections, breaker and deadline) and relays the issuer's answer. What the real gateway adds
on top — JWT verification and its cache, the per-IP limit and the shopper's allowance, the
spec cache, the sold-out lane, holders and unsettled shoppers, the in-flight bound, rate-limit
headers, problem+json for bad input, RED metrics, tracing — it leaves out. So `make
bench-gateway`'s gateway/floor is what those rules cost, and floor/issuer-direct what one more
HTTP hop, batched, allows on this box.

Configured as the gateway is (FLASHCOUPON_GATEWAY_*: the issuer's URL, the batch size, the
pool's connections and timeout); presses go to the first issuer. The ASGI part is
flashcoupon_loadtest.floor's. Under uvicorn a press is answered once the batcher's future for
it is done, without uvicorn's cycle (`direct_answer`, flashcoupon_common.httpserver.Later), as
the gateway answers its forwarded presses.
"""

from __future__ import annotations

import asyncio

import orjson
from flashcoupon_common.http import Headers, Reply
from flashcoupon_common.httpserver import Later
from flashcoupon_common.issue_batch import Press
from flashcoupon_gateway.auth import b64url_decode
from flashcoupon_gateway.issue_batch import IssueBatcher
from flashcoupon_gateway.routes import ISSUE_PATH, relay
from flashcoupon_gateway.settings import GatewaySettings
from flashcoupon_gateway.upstream import Answer, Forwarder
from starlette.types import Scope

from flashcoupon_loadtest.floor import Floor

ISSUE_PREFIX, ISSUE_SUFFIX = ISSUE_PATH.split("{eventId}")


def subject(authorization: bytes) -> str:
    """The `sub` of a `Bearer <jwt>` header, read without verifying anything."""
    payload = authorization.partition(b" ")[2].split(b".")[1]
    sub: str = orjson.loads(b64url_decode(payload))["sub"]
    return sub


def _relayed(answering: asyncio.Future[Answer]) -> Reply:
    return relay(answering.result(), [])  # as the gateway relays it, without RateLimit-*


class GatewayFloor(Floor):
    def __init__(self) -> None:
        super().__init__(ISSUE_PREFIX, ISSUE_SUFFIX)
        self.forwarder: Forwarder | None = None
        self.batcher: IssueBatcher | None = None

    async def press(self, event_id: str, headers: Headers) -> Reply:
        answering = self._forwarded(event_id, headers)
        await answering
        return _relayed(answering)

    def direct_answer(self, scope: Scope) -> Later | None:
        """A press answered by the server once the issuer's answer is in (DirectAnswer)."""
        event_id = self.pressed_event(scope)
        if event_id is None:
            return None
        return Later(self._forwarded(event_id, scope["headers"]), _relayed)

    def _forwarded(self, event_id: str, headers: Headers) -> asyncio.Future[Answer]:
        assert self.forwarder is not None and self.batcher is not None  # started
        user = ""
        key = None
        for name, value in headers:
            if name == b"authorization":
                user = subject(value)
            elif name == b"idempotency-key":
                key = value.decode("latin-1")
        press = Press(event_id, user, key, None, None)  # no traceparent, no allowance
        return self.batcher.issue(self.forwarder.issuers[0], press)

    async def start(self) -> None:
        settings = GatewaySettings.from_env()
        self.forwarder = Forwarder.from_settings(settings)
        self.batcher = IssueBatcher(self.forwarder, max(1, settings.issue_batch_max))

    async def stop(self) -> None:
        if self.batcher is not None:
            await self.batcher.aclose()
        if self.forwarder is not None:
            await self.forwarder.aclose()


app = GatewayFloor()
