"""The gateway's composition root: create_app(settings, *, redis=None, http_client=None)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx
from flashcoupon_common import channels, heap, keys, tracing
from flashcoupon_common.holders import Holders, scan_holders
from flashcoupon_common.http import JSONResponse, exception_handlers, health_routes
from flashcoupon_common.probes import BoundedProbe, readiness, redis_probe
from flashcoupon_common.red_metrics import REDMiddleware
from flashcoupon_common.redis_cluster import create_redis_cluster
from redis.asyncio.cluster import RedisCluster
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from flashcoupon_gateway.admission import SpecCache
from flashcoupon_gateway.auth import Authenticator, JWKSCache
from flashcoupon_gateway.fastpath import IssueFastPath
from flashcoupon_gateway.issue_batch import IssueBatcher
from flashcoupon_gateway.metrics import IN_FLIGHT
from flashcoupon_gateway.openapi import OPENAPI
from flashcoupon_gateway.ratelimit import RateLimiter
from flashcoupon_gateway.routes import ROUTES
from flashcoupon_gateway.scripts import ScriptRunner
from flashcoupon_gateway.service import STORE_ERRORS, Gateway, store_unavailable
from flashcoupon_gateway.settings import GatewaySettings
from flashcoupon_gateway.sold_out import SoldOutBoard
from flashcoupon_gateway.upstream import Forwarder
from flashcoupon_gateway.waiting_room import WaitingRoom

logger = logging.getLogger(__name__)


async def openapi(request: Request) -> Response:
    return JSONResponse(OPENAPI)


async def redis_unavailable(request: Request, exc: Exception) -> Response:
    return store_unavailable(request.url.path, exc)


def create_app(
    settings: GatewaySettings,
    *,
    redis: RedisCluster | None = None,
    http_client: httpx.AsyncClient | None = None,
) -> IssueFastPath:
    probes: dict[str, BoundedProbe] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[Mapping[str, Any]]:
        own_redis = redis is None
        client = redis if redis is not None else create_redis_cluster(settings.redis)
        await client.initialize()
        # httpx only fetches the JWKS (rarely); forwarding uses pool.HTTPPool.
        own_http = http_client is None
        http = http_client or httpx.AsyncClient(timeout=settings.upstream_timeout_seconds)
        runner = ScriptRunner(client)
        jwks = (
            JWKSCache(settings.auth.jwks_url, settings.auth.jwks_ttl_seconds, http)
            if settings.auth.jwks_url
            else None
        )
        holders = Holders(functools.partial(scan_holders, client))
        board = SoldOutBoard(on_reopen=holders.forget)
        room = WaitingRoom(
            runner,
            settings.ticket_secret,
            ticket_ttl_seconds=settings.ticket_ttl_seconds,
            sold_out=board,
        )
        specs = SpecCache(client, settings.spec_cache_seconds, board)
        forwarder = Forwarder.from_settings(settings)
        batcher = (
            IssueBatcher(forwarder, settings.issue_batch_max) if settings.issue_batch_max else None
        )
        gateway = Gateway(
            settings=settings,
            auth=Authenticator(settings.auth, jwks=jwks),
            limiter=RateLimiter(runner, event_shards=settings.limits.event_shards),
            room=room,
            specs=specs,
            upstream=forwarder,
            sold_out=board,
            holders=holders,
            batcher=batcher,
        )
        probes["redis"] = redis_probe(client)
        IN_FLIGHT.set_function(lambda: gateway.in_flight)  # read at scrape time, not per request
        room.start()

        def on_news(channel: str, event_id: str) -> None:
            if channel == keys.SUPPLY_CHANNEL:
                specs.forget(event_id)
            board.heard(channel, event_id)

        stop = asyncio.Event()
        news = asyncio.create_task(
            channels.listen(client, (keys.SOLD_OUT_CHANNEL, keys.SUPPLY_CHANNEL), on_news, stop)
        )
        heap.settle_after_startup()
        try:
            yield {"gateway": gateway}
        finally:
            stop.set()
            try:
                await asyncio.wait_for(news, 3.0)
            except TimeoutError:
                logger.warning("channel listener did not stop in time; abandoned")
            await room.stop()
            await specs.aclose()
            if batcher is not None:
                await batcher.aclose()
            await gateway.upstream.aclose()
            await runner.aclose()
            await probes.pop("redis").close()
            if own_http:
                await http.aclose()
            if own_redis:
                await client.aclose()
            await tracing.flush()

    async def ready() -> dict[str, bool]:
        return await readiness(probes)  # bounded even when Redis hangs

    app = Starlette(
        routes=[*ROUTES, Route("/openapi.json", openapi, methods=["GET"]), *health_routes(ready)],
        exception_handlers={
            **exception_handlers(),
            **dict.fromkeys(STORE_ERRORS, redis_unavailable),
        },
        middleware=[Middleware(REDMiddleware, service="gateway")],
        lifespan=lifespan,
    )
    # The fast path wraps the app from outside: it serves POST .../issue itself, skipping
    # Starlette's per-request layers too, and passes everything else on.
    return IssueFastPath(app)
