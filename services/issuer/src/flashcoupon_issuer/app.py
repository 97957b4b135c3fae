"""The issuer's composition root: one lifespan owns the Redis Cluster client and the batcher.

Besides HTTP, the lifespan runs one pub/sub listener: issue.lua publishes on SOLD_OUT_CHANNEL
when an event's last coupon goes (every issuer learns it at once) and provisioning publishes on
SUPPLY_CHANNEL (every issuer forgets a sold-out flag when supply was raised; when the event was
deleted, also its metric series). If the listener is down, the flag's TTL still bounds how stale
it can be.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from flashcoupon_common import channels, heap, keys, tracing
from flashcoupon_common.holders import Holders, scan_holders
from flashcoupon_common.http import exception_handlers, health_routes
from flashcoupon_common.lua import ISSUE, ISSUE_FIELD_ENTRIES, LuaScript
from flashcoupon_common.probes import BoundedProbe, readiness, redis_probe
from flashcoupon_common.red_metrics import REDMiddleware
from flashcoupon_common.redis_batch import ScriptBatcher
from flashcoupon_common.redis_cluster import create_redis_cluster
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.types import ASGIApp

from flashcoupon_issuer import http, metrics
from flashcoupon_issuer.issuance import (
    AllowanceLimit,
    IssueService,
    ScriptCall,
    ScriptPress,
    SoldOutCache,
)
from flashcoupon_issuer.settings import IssuerSettings

logger = logging.getLogger(__name__)
_NO_ALLOWANCE = ("", "")  # issue.lua's two allowance values for a press it does not limit


def press_argv(user: str, rid: str, tp: str, allowance: AllowanceLimit) -> tuple[str | int, ...]:
    """One press's ARGV values for issue.lua (LuaScript.stride of them); `make bench-master`
    builds its presses with it too."""
    return (user, rid, tp, *(allowance or _NO_ALLOWANCE))


def issue_script(settings: IssuerSettings) -> LuaScript:
    """issue.lua, writing outbox entries in the shape the settings ask for."""
    return ISSUE_FIELD_ENTRIES if settings.outbox_entry == "fields" else ISSUE


def script_argv(presses: Sequence[ScriptPress]) -> list[str | int]:
    """issue.lua's ARGV for presses of one event: each press's values, one after another."""
    argv: list[str | int] = []
    for user, rid, tp, allowance in presses:
        argv += press_argv(user, rid, tp, allowance)
    return argv


def batched_call(batcher: ScriptBatcher, script: LuaScript) -> ScriptCall:
    # The lifespan initializes the cluster client before serving, so `submit_many` may be used:
    # the replies' future is awaited by IssueService directly (a coroutine frame less per
    # call), one future for every press of the call.
    def call(
        event_id: str, presses: Sequence[ScriptPress], deadline: float | None
    ) -> Awaitable[list[Any]]:
        argv = script_argv(presses)
        return batcher.submit_many(script, keys.issue_keys(event_id), argv, deadline)

    return call


def naive_call(redis: RedisCluster, script: LuaScript) -> ScriptCall:
    """One EVALSHA round trip per call (the benchmark's baseline)."""

    async def call(
        event_id: str, presses: Sequence[ScriptPress], deadline: float | None
    ) -> list[Any]:
        k = keys.issue_keys(event_id)  # redis-py retries on its own terms; `deadline` unused
        args = script_argv(presses)
        try:
            replies = await redis.evalsha(script.sha, len(k), *k, *args)
        except NoScriptError:
            replies = await redis.eval(script.source, len(k), *k, *args)
        return list(replies)

    return call


async def listen_for_supply(
    redis: RedisCluster, service: IssueService, stop: asyncio.Event
) -> None:
    """Keep the sold-out flags in step with the channels (a lost node: the TTL covers the gap)."""

    async def on_news(channel: str, event_id: str) -> None:
        exists = bool(await redis.exists(keys.config_key(event_id)))
        if channel != keys.SUPPLY_CHANNEL:
            # Not for a deleted event: messages published on different nodes reach this
            # subscription over the cluster bus in any order, so a sell-out may arrive after
            # the deletion that followed it, and would then flag an event that is gone.
            if exists:
                service.learn_sold_out(event_id)
        elif exists:
            service.supply_changed(event_id)
            metrics.watch_event(event_id)  # its outcome series exist before the doors open
        else:
            service.forget_event(event_id)  # deleted

    await channels.listen(redis, (keys.SUPPLY_CHANNEL, keys.SOLD_OUT_CHANNEL), on_news, stop)


def create_app(settings: IssuerSettings, *, redis: RedisCluster | None = None) -> ASGIApp:
    """The issuer's ASGI app: IssueEdge serves the issue endpoint, Starlette everything else.

    IssueEdge wraps the Starlette app from outside rather than sitting in its middleware
    stack: the hot endpoint then skips Starlette's own per-request layers (scope set-up, the
    error middleware's send wrapper); IssueEdge answers its own errors as problem+json.
    """
    probes: dict[str, BoundedProbe] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        client = (
            redis
            if redis is not None
            else create_redis_cluster(
                settings.redis, max_connections=settings.redis_max_connections
            )
        )
        await client.initialize()
        app.state.redis_client = client
        probes["redis"] = redis_probe(client)
        batcher = ScriptBatcher(
            client,
            client="issuer",
            max_batch=settings.max_batch,
            max_inflight=settings.max_inflight,
            wait_replicas=1 if settings.durability == "replica" else 0,
            wait_timeout_ms=settings.wait_timeout_ms,
            retry_deadline=settings.retry_deadline_s,
        )
        cache = SoldOutCache(settings.sold_out_ttl_s)
        script = issue_script(settings)
        call = batched_call(batcher, script) if settings.batching else naive_call(client, script)
        service = IssueService(
            call,
            cache,
            holders=Holders(functools.partial(scan_holders, client)),
            retry_deadline_s=settings.retry_deadline_s,
            deadline_margin_ms=settings.deadline_margin_ms,
            unconfirmed=settings.unconfirmed,
        )
        stop = asyncio.Event()
        listener = asyncio.create_task(listen_for_supply(client, service, stop))
        heap.settle_after_startup()
        logger.info(
            "issuer ready: durability=%s unconfirmed=%s batching=%s decide_allowance=%s "
            "outbox_entry=%s",
            settings.durability,
            settings.unconfirmed,
            settings.batching,
            settings.decide_allowance,
            settings.outbox_entry,
        )
        try:
            yield {"service": service, "redis": client, "batcher": batcher}
        finally:
            stop.set()
            try:
                await asyncio.wait_for(listener, 3.0)
            except (TimeoutError, asyncio.CancelledError):
                logger.warning("supply listener did not stop in time; abandoned")
            await batcher.aclose()
            await probes.pop("redis").close()
            if redis is None:
                await client.aclose()
            await tracing.flush()

    async def ready() -> dict[str, bool]:
        return await readiness(probes)  # bounded even when Redis hangs

    app = Starlette(
        routes=[*http.routes(), *health_routes(ready)],
        exception_handlers=exception_handlers(),
        middleware=[Middleware(REDMiddleware, service="issuer")],
        lifespan=lifespan,
    )
    return http.IssueEdge(app, decide_allowance=settings.decide_allowance)
