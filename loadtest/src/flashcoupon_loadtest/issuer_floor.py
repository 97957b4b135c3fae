"""The issuer's floor: a press served with nothing but what every issuer on this stack needs.

An ASGI app, a benchmark baseline like hello-world (flashcoupon_loadtest.hello), not a service:
it reads the two headers a press carries (X-Flashcoupon-User, Idempotency-Key), submits the press
to the issuer's own batcher (flashcoupon_common.redis_batch) running issue.lua on the event's
master, and answers 201 with the coupon as JSON, or 409 with the script's status. What the real
issuer adds on top — input validation, problem+json answers, the sold-out flag and the holders,
the replay cache, the unsettled shoppers, deadlines, RED and outcome metrics, tracing — it
leaves out, so `make bench-issuer`'s issuer/floor is what those rules cost, and floor/hello what
the architecture itself allows (one HTTP request per press, a Redis batch per loop turn). The
ASGI part is flashcoupon_loadtest.floor's. Under uvicorn a press is answered as the issuer
answers its lone presses, from the script call's done callback without uvicorn's cycle
(`direct_answer`, flashcoupon_common.httpserver.Later): the architecture's own server lane.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import orjson
from flashcoupon_common import keys
from flashcoupon_common.http import JSON_HEADERS, Headers, Reply
from flashcoupon_common.httpserver import Later
from flashcoupon_common.lua import ISSUE
from flashcoupon_common.redis_batch import ScriptBatcher
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_issuer.http import ISSUE_PREFIX, ISSUE_SUFFIX
from flashcoupon_issuer.settings import IssuerSettings
from starlette.types import Scope

from flashcoupon_loadtest.floor import Floor
from flashcoupon_loadtest.localrun import stack_env


def answer(event_id: str, user: str, reply: list[Any]) -> tuple[int, bytes]:
    """(status, body) for one press's issue.lua reply (layout at the top of issue.lua)."""
    status = reply[0].decode()
    if status != "ISSUED":
        return 409, orjson.dumps({"code": status})
    code, tier, kind = reply[4].decode(), reply[5].decode(), reply[6].decode()
    body = {
        "eventId": event_id,
        "userId": user,
        "couponCode": code,
        "tier": tier,
        "discount": {"type": kind},
        "issuedAt": int(reply[10]),
        "expiresAt": int(reply[11]),
    }
    return 201, orjson.dumps(body)


def _reply(event_id: str, user: str, call: asyncio.Future[Any]) -> Reply:
    status, body = answer(event_id, user, call.result())
    return Reply.of(status, JSON_HEADERS, body)


class IssuerFloor(Floor):
    def __init__(self) -> None:
        super().__init__(ISSUE_PREFIX, ISSUE_SUFFIX)
        self.batcher: ScriptBatcher | None = None

    async def press(self, event_id: str, headers: Headers) -> Reply:
        user, call = self._submit(event_id, headers)
        await call  # a failed call raises here, as the floor always let it
        return _reply(event_id, user, call)

    def direct_answer(self, scope: Scope) -> Later | None:
        """A press answered by the server once its script call is done (DirectAnswer)."""
        event_id = self.pressed_event(scope)
        if event_id is None:
            return None
        user, call = self._submit(event_id, scope["headers"])
        return Later(call, functools.partial(_reply, event_id, user))

    def _submit(self, event_id: str, headers: Headers) -> tuple[str, asyncio.Future[Any]]:
        assert self.batcher is not None  # started
        user = key = ""
        for name, value in headers:
            if name == b"x-flashcoupon-user":
                user = value.decode()
            elif name == b"idempotency-key":
                key = value.decode()
        press = (user, key, "", "", "")  # no traceparent, no allowance
        return user, self.batcher.submit(ISSUE, keys.issue_keys(event_id), press)

    async def start(self) -> None:
        settings = IssuerSettings.from_env(stack_env())  # the issuer's batching, too
        client = create_redis_cluster(settings.redis)
        await client.initialize()
        self.batcher = ScriptBatcher(
            client,
            client="floor",
            max_batch=settings.max_batch,
            max_inflight=settings.max_inflight,
        )

    async def stop(self) -> None:
        if self.batcher is not None:
            await self.batcher.aclose()
            await self.batcher.redis.aclose()


app = IssuerFloor()
