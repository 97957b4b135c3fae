"""Auto-pipelining of Lua script calls over a Redis Cluster.

redis-py has no auto-pipelining, and its ClusterPipeline refuses EVALSHA, so concurrent script
calls would each pay a round trip. `ScriptBatcher.call()` queues the call on the node that owns
its slot; once per event-loop tick (or when `max_batch` calls are waiting) each node's queue is
written as one pipeline of EVALSHAs on one connection of that node, and the replies are read
back in order. A node has at most `max_inflight` batches on the wire; calls arriving meanwhile
wait for the next batch, so batches grow with load instead of connections.

The subtle part is retrying. A call is retried after NOSCRIPT (SCRIPT LOAD first: a restarted
or promoted node has an empty script cache), MOVED/TRYAGAIN/CLUSTERDOWN and connection errors
(the slot map is refreshed: after a failover the slot has a new owner). A retry may re-run a
script whose first reply was lost, so scripts called through here must be idempotent per call
— issue.lua is, by its request id.

With `wait_replicas` > 0 every batch ends with `WAIT <n> <ms>` on the same connection, right
after the scripts: Redis answers it when n replicas acknowledged every write made so far on
that connection, so one WAIT covers the whole batch. If fewer replicas acknowledged in time,
each call raises NotReplicatedError carrying its result: the caller decides what an
unconfirmed write means.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Histogram
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from flashcoupon_common.lua import LuaScript

logger = logging.getLogger(__name__)

BATCH_SIZE = Histogram(
    "flashcoupon_redis_batch_size",
    "Script calls sent in one pipeline to one Redis node",
    ["client"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
)

Arg = str | bytes | int | float
_TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError, asyncio.TimeoutError)
_REROUTE = (MovedError, TryAgainError, ClusterDownError, ReadOnlyError)


class NotReplicatedError(Exception):
    """The script ran, but WAIT saw fewer replicas acknowledge it than required."""

    def __init__(self, result: Any, acked: int) -> None:
        super().__init__(f"write acknowledged by {acked} replica(s) only")
        self.result = result
        self.acked = acked


@dataclass(slots=True)
class _Call:
    script: LuaScript
    keys: Sequence[str]
    args: Sequence[Arg]
    future: asyncio.Future[Any]
    deadline: float
    attempts: int = 0


@dataclass(slots=True)
class _NodeQueue:
    calls: deque[_Call] = field(default_factory=deque)
    inflight: int = 0
    scheduled: bool = False


class ScriptBatcher:
    def __init__(
        self,
        redis: RedisCluster,
        *,
        client: str = "default",
        max_batch: int = 512,
        max_inflight: int = 2,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 100,
        command_timeout: float = 5.0,
        retry_deadline: float = 20.0,
    ) -> None:
        self.redis = redis
        self.max_batch = max_batch
        self.max_inflight = max_inflight
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.command_timeout = command_timeout
        self.retry_deadline = retry_deadline
        self._sizes = BATCH_SIZE.labels(client)
        self._queues: dict[str, _NodeQueue] = {}
        self._refreshing: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def call(self, script: LuaScript, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """EVALSHA `script` with `keys` (one slot) and `args`, sharing a round trip."""
        loop = asyncio.get_running_loop()
        if not self.redis.nodes_manager.slots_cache:
            await self.redis.initialize()
        item = _Call(
            script, keys, args, loop.create_future(), time.monotonic() + self.retry_deadline
        )
        self._enqueue(item)
        # Every path settles the future before the deadline; the outer bound only guarantees
        # that a bug here can never hang a request forever.
        return await asyncio.wait_for(item.future, self.retry_deadline + self.command_timeout + 5)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for queue in self._queues.values():
            for item in queue.calls:
                if not item.future.done():
                    item.future.cancel()

    # ---- queueing
    def _enqueue(self, item: _Call) -> None:
        try:
            node = self.redis.nodes_manager.get_node_from_slot(self.redis.keyslot(item.keys[0]))
        except Exception as exc:  # noqa: BLE001 - slot not covered right now: retry later
            self._retry_later(item, exc)
            return
        queue = self._queues.setdefault(node.name, _NodeQueue())
        queue.calls.append(item)
        if not queue.scheduled:
            queue.scheduled = True
            asyncio.get_running_loop().call_soon(self._flush, node.name)

    def _flush(self, name: str) -> None:
        queue = self._queues[name]
        queue.scheduled = False
        node = self.redis.nodes_manager.nodes_cache.get(name)
        while queue.calls and queue.inflight < self.max_inflight:
            batch = [queue.calls.popleft() for _ in range(min(self.max_batch, len(queue.calls)))]
            if node is None:  # the node left the slot map since these were queued
                for item in batch:
                    self._enqueue(item)
                continue
            queue.inflight += 1
            self._spawn(self._send(node, queue, batch))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- one pipeline on one connection
    async def _send(self, node: ClusterNode, queue: _NodeQueue, batch: list[_Call]) -> None:
        self._sizes.observe(len(batch))
        commands: list[tuple[Arg, ...]] = [
            ("EVALSHA", c.script.sha, len(c.keys), *c.keys, *c.args) for c in batch
        ]
        if self.wait_replicas:
            commands.append(("WAIT", self.wait_replicas, self.wait_timeout_ms))
        replies: list[Any] = []
        connection = node.acquire_connection()
        try:
            timeout = self.command_timeout + self.wait_timeout_ms / 1000
            async with asyncio.timeout(timeout):
                await connection.send_packed_command(connection.pack_commands(commands))
                for _ in commands:
                    try:
                        replies.append(await connection.read_response())
                    except ResponseError as exc:
                        replies.append(exc)
        except _TRANSIENT as exc:
            # The connection state is unknown (a reply may be half read): drop it.
            await connection.disconnect()
            logger.warning("redis batch of %d to %s failed: %r", len(batch), node.name, exc)
            self._refresh_soon()
            for item in batch[len(replies) :]:
                self._retry_later(item, exc)
            batch = batch[: len(replies)]
        except BaseException:
            await connection.disconnect()
            raise
        finally:
            node.release(connection)
            queue.inflight -= 1
            if queue.calls and not queue.scheduled:
                queue.scheduled = True
                asyncio.get_running_loop().call_soon(self._flush, node.name)
        acked = replies[-1] if self.wait_replicas and len(replies) == len(commands) else None
        await self._settle(node, batch, replies, acked)

    async def _settle(
        self, node: ClusterNode, batch: list[_Call], replies: list[Any], acked: Any
    ) -> None:
        reload = False
        for item, reply in zip(batch, replies, strict=False):
            if item.future.done():
                continue
            if isinstance(reply, NoScriptError):
                reload = True
            elif isinstance(reply, AskError) and not isinstance(reply, MovedError):
                self._spawn(self._ask(item, reply))
            elif isinstance(reply, _REROUTE):
                self._refresh_soon()
                self._retry_later(item, reply)
            elif isinstance(reply, ResponseError):
                item.future.set_exception(reply)
            elif self.wait_replicas and (not isinstance(acked, int) or acked < self.wait_replicas):
                item.future.set_exception(NotReplicatedError(reply, int(acked or 0)))
            else:
                item.future.set_result(reply)
        if reload:
            missing = [
                i for i, r in zip(batch, replies, strict=False) if isinstance(r, NoScriptError)
            ]
            try:
                for script in {i.script.sha: i.script for i in missing}.values():
                    await node.execute_command("SCRIPT", "LOAD", script.source)
            except Exception as exc:  # noqa: BLE001 - the retry path decides when to give up
                logger.warning("SCRIPT LOAD on %s failed: %r", node.name, exc)
            for item in missing:
                self._retry_later(item, None)

    async def _ask(self, item: _Call, err: AskError) -> None:
        """Slot migrating: run this one call on the importing node, after ASKING."""
        target = self.redis.get_node(err.host, err.port)
        if target is None:
            self._refresh_soon()
            self._retry_later(item, err)
            return
        try:
            args = ("EVALSHA", item.script.sha, len(item.keys), *item.keys, *item.args)
            try:
                result = await target.execute_command(*args, asking=True)
            except NoScriptError:
                await target.execute_command("SCRIPT", "LOAD", item.script.source)
                result = await target.execute_command(*args, asking=True)
            if not item.future.done():
                item.future.set_result(result)
        except Exception as exc:  # noqa: BLE001 - retried like any other failure
            self._retry_later(item, exc)

    # ---- retries
    def _retry_later(self, item: _Call, exc: BaseException | None) -> None:
        item.attempts += 1
        delay = 0.0 if exc is None else min(0.02 * 2**item.attempts, 0.5)
        if time.monotonic() + delay > item.deadline or item.attempts > 100:
            if not item.future.done():
                item.future.set_exception(
                    exc or TimeoutError("redis script call retried too often")
                )
            return
        if delay == 0.0:
            self._enqueue(item)
        else:
            asyncio.get_running_loop().call_later(delay, self._enqueue, item)

    def _refresh_soon(self) -> None:
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        try:
            await self.redis.nodes_manager.initialize()
        except Exception as exc:  # noqa: BLE001 - the next failure triggers another refresh
            logger.warning("redis cluster slot map refresh failed: %r", exc)
