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
pool's connections and timeout); presses go to the first issuer.
"""

from __future__ import annotations

import binascii

import orjson
from flashcoupon_common.issue_batch import Press
from flashcoupon_gateway.issue_batch import IssueBatcher
from flashcoupon_gateway.routes import ISSUE_PATH
from flashcoupon_gateway.settings import GatewaySettings
from flashcoupon_gateway.upstream import Answer, Forwarder
from starlette.types import Receive, Scope, Send

ISSUE_PREFIX, ISSUE_SUFFIX = ISSUE_PATH.split("{eventId}")
_B64URL_TO_STD = bytes.maketrans(b"-_", b"+/")


def subject(authorization: bytes) -> str:
    """The `sub` of a `Bearer <jwt>` header, read without verifying anything."""
    payload = authorization.partition(b" ")[2].split(b".")[1]
    padded = payload.translate(_B64URL_TO_STD) + b"=" * (-len(payload) % 4)
    sub: str = orjson.loads(binascii.a2b_base64(padded))["sub"]
    return sub


def response_headers(answer: Answer) -> list[tuple[bytes, bytes]]:
    """The relayed answer's headers, as the ASGI start message carries them."""
    headers = [(k.encode(), v.encode("latin-1")) for k, v in answer.headers.items()]
    headers.append((b"content-length", str(len(answer.body)).encode()))
    return headers


class GatewayFloor:
    def __init__(self) -> None:
        self.forwarder: Forwarder | None = None
        self.batcher: IssueBatcher | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        path: str = scope["path"]
        if (
            not (path.startswith(ISSUE_PREFIX) and path.endswith(ISSUE_SUFFIX))
            or self.forwarder is None
            or self.batcher is None
        ):
            await _send(send, 200, [], b"ok")  # /readyz and anything else: the server is up
            return
        event_id = path[len(ISSUE_PREFIX) : -len(ISSUE_SUFFIX)]
        user = ""
        key = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                user = subject(value)
            elif name == b"idempotency-key":
                key = value.decode("latin-1")
        press = Press(event_id, user, key, None, None)  # no traceparent, no allowance
        answer = await self.batcher.issue(self.forwarder.issuers[0], press)
        await _send(send, answer.status, response_headers(answer), answer.body)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                settings = GatewaySettings.from_env()
                self.forwarder = Forwarder.from_settings(settings)
                self.batcher = IssueBatcher(self.forwarder, max(1, settings.issue_batch_max))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.batcher is not None:
                    await self.batcher.aclose()
                if self.forwarder is not None:
                    await self.forwarder.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _send(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


app = GatewayFloor()
