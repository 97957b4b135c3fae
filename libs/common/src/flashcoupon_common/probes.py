"""A readiness check that cannot hang the readiness endpoint.

A timeout around a query to a hung server is not enough. Cancelling the query makes the driver
return the connection to the pool, and that reset (a rollback) waits on the same hung server,
inside the cancelled request. Seen here: a persister's /readyz hung for minutes while its
MariaDB was SIGSTOPped, because the `asyncio.timeout` around `SELECT 1` cancelled into such a
clean-up. So the check runs in a task of its own that callers wait on for at most
`timeout_s` and never cancel. While that task is still pending, later calls wait on it too
rather than start another, so a hung server costs one stuck check, not one per probe.
A Redis PING gets the same treatment: with no socket timeout set, a PING to a frozen node
never returns, and each probe would leave one more pending; a `wait_for` around a redis-py
call can lose its cancellation and wait forever (seen in the chaos harness, 2026-12-02).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping

from redis.asyncio.cluster import RedisCluster
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine


class BoundedProbe:
    def __init__(self, check: Callable[[], Awaitable[object]], timeout_s: float = 2.0) -> None:
        self._check = check
        self._timeout_s = timeout_s
        self._task: asyncio.Task[object] | None = None

    async def passes(self) -> bool:
        """True when the check completes without an error within `timeout_s`."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
            # An outcome nobody waited for is not an "exception never retrieved".
            self._task.add_done_callback(lambda t: t.cancelled() or t.exception())
        task = self._task
        done, _ = await asyncio.wait({task}, timeout=self._timeout_s)
        return bool(done) and not task.cancelled() and task.exception() is None

    async def _run(self) -> object:
        return await self._check()

    async def close(self) -> None:
        """Cancel a check still pending (on shutdown)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait({self._task}, timeout=self._timeout_s)


def database_probe(engine: AsyncEngine, timeout_s: float = 2.0) -> BoundedProbe:
    """`SELECT 1` on a pooled connection, as a BoundedProbe."""

    async def select_one() -> None:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    return BoundedProbe(select_one, timeout_s)


def redis_probe(client: RedisCluster, timeout_s: float = 2.0) -> BoundedProbe:
    """PING to the client's default node (redis-py's target for PING), as a BoundedProbe."""
    return BoundedProbe(client.ping, timeout_s)


async def readiness(probes: Mapping[str, BoundedProbe]) -> dict[str, bool]:
    """Each probe's outcome by name, for /readyz; `{"started": False}` while there are none
    (before the lifespan made them, or after it closed them)."""
    if not probes:
        return {"started": False}
    return {name: await probe.passes() for name, probe in probes.items()}
