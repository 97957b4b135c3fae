"""The persister's HTTP face: /healthz, /readyz, /metrics; its lifespan runs the consumer.

Readiness means the database answers, the consumer holds partitions (a member without an
assignment — more replicas than partitions — is alive but is doing nothing), and writes are
not stuck: a batch failing for longer than STALL_GRACE_S (say writes hang or are refused while
`SELECT 1` still works) makes the member not ready; a single retry does not.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping

from aiokafka import AIOKafkaConsumer
from flashcoupon_common import tracing
from flashcoupon_common.http import exception_handlers, health_routes
from flashcoupon_common.kafka_producer import ProducerFactory
from flashcoupon_common.probes import BoundedProbe, database_probe
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette

from .bootstrap import running
from .consumer import PersistLoop
from .settings import PersisterSettings


def create_app(
    settings: PersisterSettings,
    *,
    engine: AsyncEngine | None = None,
    consumer: AIOKafkaConsumer | None = None,
    producer_factory: ProducerFactory | None = None,
    on_fatal: Callable[[BaseException], None] | None = None,
) -> Starlette:
    state: dict[str, PersistLoop] = {}
    probes: dict[str, BoundedProbe] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with running(
            settings,
            engine=engine,
            consumer=consumer,
            producer_factory=producer_factory,
            on_fatal=on_fatal,
        ) as loop:
            state["loop"] = loop
            probes["db"] = database_probe(loop.writer.engine)
            yield
            state.pop("loop", None)
            await probes.pop("db").close()
        await tracing.flush()

    async def ready() -> Mapping[str, bool]:
        loop = state.get("loop")
        if loop is None:
            return {"started": False}
        db = await probes["db"].passes()  # bounded even when the server hangs
        return {"database": db, "assigned": loop.assigned, "writing": not loop.stalled}

    return Starlette(
        routes=health_routes(ready), lifespan=lifespan, exception_handlers=exception_handlers()
    )
