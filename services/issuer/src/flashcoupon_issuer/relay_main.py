"""`flashcoupon-relay`: the outbox relay process (several may run; they share a consumer group).

It serves /healthz, /readyz (Redis and Kafka reachable) and /metrics on its port (8084) and
relays in the background. SIGTERM (handled by uvicorn) runs the lifespan's shutdown: the relay
finishes its in-flight batches, flushes and stops the producer, then the process exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator

import uvicorn
from flashcoupon_common.http import exception_handlers, health_routes
from flashcoupon_common.logsetup import configure_logging
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import SettingsError
from redis.asyncio.cluster import RedisCluster
from starlette.applications import Starlette

from flashcoupon_issuer.relay import Relay
from flashcoupon_issuer.relay_producer import ProducerFactory
from flashcoupon_issuer.relay_settings import PREFIX, RelaySettings

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

    app = Starlette(
        routes=health_routes(relay.ready, registry=relay.metrics.registry),
        exception_handlers=exception_handlers(),
        lifespan=lifespan,
    )
    app.state.relay = relay
    return app


def _exit_if_died(task: asyncio.Task[None]) -> None:
    # run() only returns after stop(); an exception means a bug. A process that answers
    # /healthz without relaying would hide it, so ask uvicorn to shut down (and exit 1 below).
    if not task.cancelled() and task.exception() is not None:
        logger.critical("relay loop died: %r", task.exception())
        global _died
        _died = True
        os.kill(os.getpid(), signal.SIGTERM)


_died = False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashcoupon-relay", description=__doc__)
    parser.add_argument("--host", default=None, help=f"bind address ({PREFIX}HOST)")
    parser.add_argument("--port", type=int, default=None, help=f"metrics port ({PREFIX}PORT)")
    args = parser.parse_args(argv)
    configure_logging("relay", os.environ.get(PREFIX + "LOG_LEVEL", "INFO"))
    try:
        settings = RelaySettings.from_env()
    except SettingsError as exc:
        logger.critical("bad configuration: %s", exc)
        return 2
    host = args.host or settings.host
    port = args.port or settings.port
    uvicorn.run(create_app(settings), host=host, port=port, log_config=None, access_log=False)
    return 1 if _died else 0


if __name__ == "__main__":
    raise SystemExit(main())
