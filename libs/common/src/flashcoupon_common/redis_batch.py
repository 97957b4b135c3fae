"""Auto-pipelining of Lua script calls over a Redis Cluster.

redis-py has no auto-pipelining, and its ClusterPipeline refuses EVALSHA, so concurrent script
calls would each pay a round trip. `ScriptBatcher.call()` queues the call on the node that owns
its slot; at the end of each event-loop turn, and at once whenever `max_batch` calls are
waiting, each node's queue is written as one pipeline of EVALSHAs on one connection to that
node, and the replies are read back in order. Written in that very turn, not by a task a turn
later: the node then runs a batch while this process reads the next calls, where waiting for
the turn's end made them take turns (docs/issuer.md, "Batches on the wire at once"). A node
has at most `max_inflight` batches on the wire; calls arriving meanwhile wait for the next
batch, so batches grow with load instead of connections.

A script declared with a `stride` (issue.lua) takes any number of calls in one run: the calls
of a batch with the same keys (the presses of one event) are sent as one EVALSHA whose ARGV is
their arguments one after another, and its list reply is split back, one reply per call. The
script's fixed work (the call, reading the event, the clock, writing the stock back) is then
paid once per batch instead of once per press. A caller holding several such calls at once (the
issuer's batch route: a gateway's presses of one event) submits them as one (`submit_many`):
one queued item and one future for all of them, where a future each cost the issuer more per
press than the rest of the batching (docs/issuer.md, "One call per event of a batch").

The batcher keeps its own small connections per node (resp.NodeConnection: a protocol and the
hiredis parser) and writes RESP itself, with each script's "EVALSHA <sha>" encoded once:
redis-py's per-command packing and per-reply reading cost more CPU than the whole HTTP request
around them. A batch whose replies are all results is settled as its last reply is read.
redis-py's RedisCluster is still the source of the slot map.

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

Over 300 lines on purpose: the wire format (RESP, node connections) is already in resp.py, and
what is left is one class whose queueing, sending, settling and retrying share per-node state;
split further it would only scatter that state.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Histogram
from redis.asyncio.cluster import RedisCluster
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
from flashcoupon_common.resp import Arg, NodeConnection, bulk, pack

logger = logging.getLogger(__name__)

BATCH_SIZE = Histogram(
    "flashcoupon_redis_batch_size",
    "Script calls sent in one pipeline to one Redis node",
    ["client"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
)

_TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError, asyncio.TimeoutError)
_REROUTE = (MovedError, TryAgainError, ClusterDownError, ReadOnlyError)


_SLOT_CACHE_MAX = 10_000


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
    # 0: one call, its reply the future's result; n > 0: n calls of a stride script submitted
    # together (submit_many), the list of their n replies the future's result.
    count: int = 0

    @property
    def size(self) -> int:
        """How many script calls this item carries (what `max_batch` counts)."""
        return self.count or 1


@dataclass(slots=True)
class _NodeQueue:
    host: str
    port: int
    calls: deque[_Call] = field(default_factory=deque)
    queued: int = 0  # script calls in `calls` (an item of submit_many carries several)
    idle: list[NodeConnection] = field(default_factory=list)
    busy: set[NodeConnection] = field(default_factory=set)  # closed by aclose too
    inflight: int = 0
    scheduled: bool = False


@dataclass(slots=True)
class _Sent:
    """One batch as `_dispatch` prepared it: its frames, bytes and number of replies and, once
    `_write` put it on the wire, its connection and the future of its replies (`wire`)."""

    frames: list[list[_Call]]
    payload: bytes
    expected: int
    settled: list[bool] = field(default_factory=list)  # _settle_at_once settled every call
    wire: tuple[NodeConnection, asyncio.Future[list[Any]]] | None = None


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
        self._wait = pack("WAIT", wait_replicas, wait_timeout_ms) if wait_replicas else b""
        self._sizes = BATCH_SIZE.labels(client)
        self._queues: dict[str, _NodeQueue] = {}
        self._heads: dict[str, bytes] = {}  # script sha → its encoded "EVALSHA <sha>"
        self._slots: dict[str, int] = {}  # key → hash slot (a slot never changes; its owner may)
        self._refreshing: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def call(self, script: LuaScript, keys: Sequence[str], args: Sequence[Arg]) -> Awaitable[Any]:
        """EVALSHA `script` with `keys` (one slot) and `args`, sharing a round trip.

        Once the slot map is known the call is queued at once and the reply's future returned
        (no coroutine frame): calls made together share a batch however they are awaited."""
        if self.redis.nodes_manager.slots_cache:
            return self.submit(script, keys, args)
        return self._call_after_discovery(script, keys, args)

    async def _call_after_discovery(
        self, script: LuaScript, keys: Sequence[str], args: Sequence[Arg]
    ) -> Any:
        await self.redis.initialize()
        return await self.submit(script, keys, args)

    def submit(
        self,
        script: LuaScript,
        keys: Sequence[str],
        args: Sequence[Arg],
        deadline: float | None = None,
    ) -> asyncio.Future[Any]:
        """`call` without its coroutine: the future of the reply (the client is initialized).

        For hot paths that await the reply directly: one coroutine frame less per call.
        `deadline` (time.monotonic()) ends retrying earlier than `retry_deadline`; a caller
        that stops waiting should cancel the future: a cancelled call is never sent again.
        """
        return self._queued(script, keys, args, deadline, 0)

    def submit_many(
        self,
        script: LuaScript,
        keys: Sequence[str],
        args: Sequence[Arg],
        deadline: float | None = None,
    ) -> asyncio.Future[list[Any]]:
        """`submit` for several calls of a stride script on the same keys: `args` holds their
        arguments one call after another (`script.stride` each), and the future's result is
        their replies in that order. They are queued, sent, retried and failed as one item:
        one run of the script, as the batcher would have merged them anyway."""
        count, rest = divmod(len(args), script.stride) if script.stride else (0, 1)
        if not count or rest:
            raise ValueError(f"{script.name}: submit_many needs whole strides of arguments")
        return self._queued(script, keys, args, deadline, count)

    def _queued(
        self,
        script: LuaScript,
        keys: Sequence[str],
        args: Sequence[Arg],
        deadline: float | None,
        count: int,
    ) -> asyncio.Future[Any]:
        limit = time.monotonic() + self.retry_deadline
        item = _Call(
            script,
            keys,
            args,
            asyncio.get_running_loop().create_future(),
            limit if deadline is None else min(deadline, limit),
            count=count,
        )
        self._enqueue(item)
        return item.future

    async def aclose(self) -> None:
        """Cancel what is queued or in flight, wait for it to end, close every connection.

        Waiting matters: an in-flight batch ending after this returned would put its
        connection back among the idle ones, never to be closed (a ResourceWarning later)."""
        self._closed = True
        tasks = list(self._tasks)
        if self._refreshing is not None:
            tasks.append(self._refreshing)
        for task in tasks:
            task.cancel()
        for queue in self._queues.values():
            for item in queue.calls:
                if not item.future.done():
                    item.future.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for queue in self._queues.values():
            # busy: a batch put on the wire whose task was cancelled before it first ran
            for conn in [*queue.idle, *queue.busy]:
                conn.close()
            queue.idle.clear()
            queue.busy.clear()

    # ---- encoding
    def _encode(self, frame: list[_Call]) -> bytes:
        """One EVALSHA for a frame: a single call, or calls of a stride script merged."""
        first = frame[0]
        head = self._heads.get(first.script.sha)
        if head is None:
            head = self._heads[first.script.sha] = bulk("EVALSHA") + bulk(first.script.sha)
        # Keys are encoded per frame, not cached: a rate-limit key is a shopper's, seldom seen
        # twice, and an event's keys are written once per frame of many presses.
        args = first.args if len(frame) == 1 else [a for c in frame for a in c.args]
        parts = [bulk(len(first.keys)), *[bulk(k) for k in first.keys], *[bulk(a) for a in args]]
        return b"*%d\r\n" % (2 + len(parts)) + head + b"".join(parts)

    # ---- queueing
    def _enqueue(self, item: _Call) -> None:
        if self._closed:  # a retry timer firing after aclose: nobody will send it
            item.future.cancel()
            return
        try:
            slot = self._slots.get(item.keys[0])
            if slot is None:
                if len(self._slots) >= _SLOT_CACHE_MAX:
                    self._slots.clear()
                slot = self._slots[item.keys[0]] = self.redis.keyslot(item.keys[0])
            node = self.redis.nodes_manager.get_node_from_slot(slot)
        except Exception as exc:  # noqa: BLE001 - slot not covered right now: retry later
            self._retry_later(item, exc)
            return
        queue = self._queues.get(node.name)
        if queue is None:
            queue = self._queues[node.name] = _NodeQueue(node.host, int(node.port))
        queue.calls.append(item)
        queue.queued += item.size
        if queue.queued >= self.max_batch:
            self._dispatch(queue)  # a full batch goes now, not at the end of the turn
        elif not queue.scheduled:
            queue.scheduled = True
            asyncio.get_running_loop().call_soon(self._flush, queue)

    def _flush(self, queue: _NodeQueue) -> None:
        queue.scheduled = False
        self._dispatch(queue)

    def _dispatch(self, queue: _NodeQueue) -> None:
        """Put the queued calls on the wire, `max_batch` at a time, while `max_inflight` allows.

        A batch is written here, in this loop turn, on an idle connection: its node starts
        running it while this process goes on with the turn (the next presses, the next full
        batch), instead of a turn later when the batch's task first runs. Without an idle
        connection the task opens one."""
        while queue.calls and queue.inflight < self.max_inflight:
            batch = _take(queue, self.max_batch)
            # A call whose caller gave up (future cancelled) is not sent: its answer is gone,
            # so running the script now could only do something nobody is told about.
            batch = [c for c in batch if not c.future.done()]
            if not batch:
                continue
            queue.inflight += 1
            frames = _frames(batch)
            payload = b"".join([self._encode(f) for f in frames]) + self._wait
            sent = _Sent(frames, payload, len(frames) + (1 if self.wait_replicas else 0))
            if queue.idle:
                conn = queue.idle.pop()
                try:
                    self._write(queue, conn, sent)
                except RedisConnectionError:
                    queue.busy.discard(conn)
                    conn.close()  # dropped while idle: the task opens a new one
            task = asyncio.get_running_loop().create_task(self._send(queue, batch, sent))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _write(
        self, queue: _NodeQueue, conn: NodeConnection, sent: _Sent
    ) -> tuple[NodeConnection, asyncio.Future[list[Any]]]:
        """Put `sent` on the wire on `conn`, busy until `_send` has its replies."""
        queue.busy.add(conn)
        replies = conn.send(
            sent.payload,
            sent.expected,
            functools.partial(self._settle_at_once, sent.frames, sent.settled),
        )
        sent.wire = (conn, replies)
        return sent.wire

    async def _send(self, queue: _NodeQueue, batch: list[_Call], sent: _Sent) -> None:
        self._sizes.observe(sum([c.size for c in batch]))
        frames = sent.frames
        settled = sent.settled  # set by _settle_at_once when the replies needed nothing more
        wire = sent.wire
        conn = None if wire is None else wire[0]
        replies: list[Any] = []
        try:
            async with asyncio.timeout(self.command_timeout + self.wait_timeout_ms / 1000):
                if wire is None:  # not written by _dispatch: no connection was idle then
                    if queue.idle:
                        conn = queue.idle.pop()
                    else:
                        conn = await NodeConnection.open(queue.host, queue.port)
                    wire = self._write(queue, conn, sent)
                conn, waiting = wire
                replies = await conn.replies(waiting)
                missing = {
                    f[0].script.sha: f[0].script
                    for f, r in zip(frames, replies, strict=False)
                    if isinstance(r, NoScriptError)
                }
                for script in missing.values():
                    # a restarted or promoted node: load, then those calls go round again
                    await conn.roundtrip(pack("SCRIPT", "LOAD", script.source), 1)
        except _TRANSIENT as exc:
            # The connection's state is unknown (a reply may be half read): drop it.
            if conn is not None:
                queue.busy.discard(conn)
                conn.close()
                conn = None
            logger.warning(
                "redis batch of %d to %s:%d failed: %r", len(batch), queue.host, queue.port, exc
            )
            self._refresh_soon()
            if len(replies) < len(frames):
                # Some replies (and the WAIT) are missing: run the whole batch again; the
                # scripts' request ids make a second run return the first run's result.
                for item in batch:
                    self._retry_later(item, exc)
                return
        except BaseException:
            if conn is not None:
                queue.busy.discard(conn)
                conn.close()
                conn = None
            raise
        finally:
            if conn is not None:
                queue.busy.discard(conn)
                queue.idle.append(conn)
            queue.inflight -= 1
            if queue.calls and not queue.scheduled:
                queue.scheduled = True
                asyncio.get_running_loop().call_soon(self._flush, queue)
        if settled:
            return
        acked = replies[-1] if self.wait_replicas and len(replies) == sent.expected else None
        calls, answers = _unframe(frames, replies)
        self._settle(calls, answers, acked)

    def _settle_at_once(
        self, frames: list[list[_Call]], settled: list[bool], replies: list[Any]
    ) -> None:
        """The common batch, settled as its last reply is read (NodeConnection.roundtrip's
        `on_replies`): its callers resume a loop turn sooner than after this batch's task.
        A batch with any error reply (NOSCRIPT, MOVED, a script error) is left to `_send`,
        which reloads and retries; too few replicas in WAIT settle as `_settle` says."""
        for reply in replies:
            if isinstance(reply, Exception):
                return
        acked = replies[-1] if self.wait_replicas else None
        calls, answers = _unframe(frames, replies)
        self._settle(calls, answers, acked)
        settled.append(True)

    def _settle(self, batch: list[_Call], replies: list[Any], acked: Any) -> None:
        for item, reply in zip(batch, replies, strict=False):
            if item.future.done():
                continue
            if isinstance(reply, NoScriptError):
                self._retry_later(item, None)
            elif isinstance(reply, AskError) and not isinstance(reply, MovedError):
                task = asyncio.get_running_loop().create_task(self._ask(item, reply))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            elif isinstance(reply, _REROUTE):
                self._refresh_soon()
                self._retry_later(item, reply)
            elif isinstance(reply, ResponseError):
                item.future.set_exception(reply)
            elif self.wait_replicas and (not isinstance(acked, int) or acked < self.wait_replicas):
                item.future.set_exception(NotReplicatedError(reply, int(acked or 0)))
            else:
                item.future.set_result(reply)

    async def _ask(self, item: _Call, err: AskError) -> None:
        """Slot migrating: run this one call on the importing node, after ASKING."""
        try:
            conn = await NodeConnection.open(err.host, err.port)
            try:
                payload = pack("ASKING") + self._encode([item])
                _, reply = await conn.roundtrip(payload, 2)
                if isinstance(reply, NoScriptError):
                    await conn.roundtrip(pack("SCRIPT", "LOAD", item.script.source), 1)
                    _, reply = await conn.roundtrip(payload, 2)
            finally:
                conn.close()
            _, (reply,) = _unframe([[item]], [reply])
            if isinstance(reply, Exception):
                self._retry_later(item, reply)
            elif not item.future.done():
                item.future.set_result(reply)
        except Exception as exc:  # noqa: BLE001 - retried like any other failure
            self._retry_later(item, exc)

    # ---- retries
    def _retry_later(self, item: _Call, exc: BaseException | None) -> None:
        if item.future.done():
            return  # the caller gave up (cancelled): not retried
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


def _take(queue: _NodeQueue, max_batch: int) -> list[_Call]:
    """The next batch off the queue: its first item, and the items after it while the batch
    stays within `max_batch` script calls (an item of submit_many is not split)."""
    calls = queue.calls
    first = calls.popleft()
    batch, taken = [first], first.size
    while calls and taken + calls[0].size <= max_batch:
        item = calls.popleft()
        batch.append(item)
        taken += item.size
    queue.queued -= taken
    return batch


def _frames(batch: list[_Call]) -> list[list[_Call]]:
    """The batch as EVALSHAs to send: calls of a stride script with the same keys (presses of
    one event) become one frame, in the order their first call was queued; others stay one
    call per frame."""
    frames: list[list[_Call]] = []
    merged: dict[tuple[str, tuple[str, ...]], list[_Call]] = {}
    for call in batch:
        if not call.script.stride:
            frames.append([call])
            continue
        key = (call.script.sha, tuple(call.keys))
        frame = merged.get(key)
        if frame is None:
            frame = merged[key] = []
            frames.append(frame)
        frame.append(call)
    return frames


def _unframe(frames: list[list[_Call]], replies: list[Any]) -> tuple[list[_Call], list[Any]]:
    """Each call with its own reply: a stride script answers a list, one reply per call; an
    error reply (NOSCRIPT, MOVED, ...) concerns every call of its frame; an item of
    submit_many gets the list of its calls' replies. Frames without a reply (a pipeline cut
    short) are left out, as before."""
    calls: list[_Call] = []
    answers: list[Any] = []
    for frame, reply in zip(frames, replies, strict=False):
        calls.extend(frame)
        if not frame[0].script.stride:
            answers.append(reply)
            continue
        size = sum([c.size for c in frame])
        if isinstance(reply, Exception):
            answers.extend([reply] * len(frame))
        elif not isinstance(reply, list) or len(reply) != size:
            bad = ResponseError(f"{frame[0].script.name}: {size} calls, reply {reply!r:.80}")
            answers.extend([bad] * len(frame))
        else:
            at = 0
            for c in frame:
                answers.append(reply[at : at + c.count] if c.count else reply[at])
                at += c.size
    return calls, answers
