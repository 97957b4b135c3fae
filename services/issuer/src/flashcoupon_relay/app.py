"""The relay process's composition root: the relay with its health and metrics routes.

It serves /healthz, /readyz (Redis and Kafka reachable) and /metrics on its port (8084) and
relays in the background. SIGTERM (handled by uvicorn) runs the lifespan's shutdown: the relay
finishes its in-flight batches, flushes and stops the producer, then the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator

from flashcoupon_common import tracing
from flashcoupon_common.http import exception_handlers, health_routes
from flashcoupon_common.kafka_producer import ProducerFactory
from flashcoupon_common.redis_cluster import create_redis_cluster
from redis.asyncio.cluster import RedisCluster
from starlette.applications import Starlette

from flashcoupon_relay.relay import Relay
from flashcoupon_relay.settings import RelaySettings

logger = logging.getLogger(__name__)


def create_app(
    settings: RelaySettings,
    *,
    redis: RedisCluster | None = None,
    producer_factory: ProducerFactory | None = None,
) -> Starlette:
    """The relay with its health/metrics routes; the lifespan runs and stops the relay."""
    own_redis = redis is None
    client = redis if redis is not None else create_redis_cluster(settings.redis)
    relay = Relay(settings, client, producer_factory=producer_factory)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(relay.run(), name="relay")
        task.add_done_callback(_exit_if_died)
        logger.info("relay %s started (topic %s)", settings.consumer, settings.topic)
        try:
            yield
        finally:
            relay.stop()
            await asyncio.wait([task])
            if own_redis:
                await client.aclose()
            await tracing.flush()

    app = Starlette(
        routes=health_routes(relay.ready, registry=relay.metrics.registry),
        exception_handlers=exception_handlers(),
        lifespan=lifespan,
    )
    app.state.relay = relay
    return app


def _exit_if_died(task: asyncio.Task[None]) -> None:
    # run() only returns after stop(); an exception means a bug. A process that answers
    # /healthz without relaying would hide it, so ask uvicorn to shut down (the process then
    # exits 1: see __main__).
    if not task.cancelled() and task.exception() is not None:
        logger.critical("relay loop died: %r", task.exception())
        died.set()
        os.kill(os.getpid(), signal.SIGTERM)


# Set when the relay loop died (read by __main__ for the exit status).
died = threading.Event()
