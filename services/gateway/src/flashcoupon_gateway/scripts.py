"""Running the gateway's Lua scripts on Redis Cluster: one EVALSHA per decision, batched.

Calls go through flashcoupon_common.redis_batch.ScriptBatcher, so concurrent decisions whose
keys live on the same node share one pipelined round trip (NOSCRIPT reload and MOVED/failover
retries included). The batcher may re-run a script whose reply was lost (a connection
dropped after Redis ran it): a rate-limit decision then counts one request twice, which errs
on the safe side; a queued shopper's `enter` re-run finds the ticket it created; an admission
`consume` re-run answers "gone" (the SSE stream says so and the shopper presses again).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from importlib.resources import files
from typing import Any

from flashcoupon_common.lua import LuaScript
from flashcoupon_common.redis_batch import ScriptBatcher
from redis.asyncio.cluster import RedisCluster


def _load(name: str) -> LuaScript:
    source = (files("flashcoupon_gateway") / "lua" / f"{name}.lua").read_text(encoding="utf-8")
    return LuaScript.from_source(name, source)


RATELIMIT = _load("ratelimit")
WAITING_ROOM = _load("waiting_room")
HOLDS = _load("holds")

Arg = str | int | float | bytes


class ScriptRunner:
    """The seam between the gateway's decisions and Redis (one place to swap the transport)."""

    def __init__(self, redis: RedisCluster) -> None:
        self.redis = redis
        # Fail fast: a shopper should get a 503 within seconds, not wait out a long failover.
        self._batcher = ScriptBatcher(
            redis, client="gateway", command_timeout=1.0, retry_deadline=3.0
        )

    def run(self, script: LuaScript, keys: Sequence[str], args: Sequence[Arg]) -> Awaitable[Any]:
        return self._batcher.call(script, keys, args)

    async def aclose(self) -> None:
        await self._batcher.aclose()
