"""The wallet's composition root: `create_app` builds everything, the lifespan owns the clients.

An engine passed in belongs to the caller (tests) and is not closed here.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from flashcoupon_common.db.engine import create_engine
from flashcoupon_common.http import exception_handlers, health_routes
from flashcoupon_common.kafka_producer import ProducerFactory
from flashcoupon_common.probes import BoundedProbe, database_probe
from flashcoupon_common.red_metrics import REDMiddleware
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.middleware import Middleware

from flashcoupon_wallet.http import on_database_unavailable, on_redemption_error, routes
from flashcoupon_wallet.publisher import RedeemedPublisher
from flashcoupon_wallet.redemption import RedemptionError
from flashcoupon_wallet.settings import WalletSettings

logger = logging.getLogger(__name__)


def create_app(
    settings: WalletSettings,
    *,
    engine: AsyncEngine | None = None,
    producer_factory: ProducerFactory | None = None,
) -> Starlette:
    clients: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        db = engine or create_engine(settings.mysql, pool_size=settings.db_pool_size)
        publisher = RedeemedPublisher(
            db,
            settings.kafka.bootstrap,
            settings.redeemed_topic,
            producer_factory=producer_factory,
            batch_size=settings.publish_batch,
            poll_seconds=settings.publish_poll_seconds,
        )
        await publisher.start()
        clients.update(engine=db, publisher=publisher, probe=database_probe(db))
        try:
            yield {"engine": db, "publisher": publisher, "settings": settings}
        finally:
            await clients["probe"].close()
            clients.clear()
            await publisher.stop(settings.publish_drain_seconds)
            if engine is None:
                await db.dispose()
            logger.info("wallet stopped")

    async def ready() -> dict[str, bool]:
        # Only MySQL decides readiness: redemption works without Kafka (events wait in the
        # outbox table), so a Kafka outage must not take the wallet out of the load balancer.
        probe: BoundedProbe | None = clients.get("probe")
        return {"mysql": probe is not None and await probe.passes()}

    handlers = {
        **exception_handlers(),
        RedemptionError: on_redemption_error,
        # connection refused/lost, server gone, pool timeout
        OperationalError: on_database_unavailable,
        InterfaceError: on_database_unavailable,
        PoolTimeout: on_database_unavailable,
    }
    return Starlette(
        routes=[*routes, *health_routes(ready)],
        exception_handlers=handlers,
        middleware=[Middleware(REDMiddleware, service="wallet")],
        lifespan=lifespan,
    )
