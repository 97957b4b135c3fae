"""Listening to the event channels (keys.SOLD_OUT_CHANNEL, keys.SUPPLY_CHANNEL) on Redis Cluster.

Classic PUBLISH is broadcast to every node of a cluster, so one subscription on any node hears
every event's news. A lost node means a gap: the listener reconnects to another node after a
second, and whatever was published meanwhile is missed — callers must also learn the same
facts another way (a TTL, or a periodic read of the event's state).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

logger = logging.getLogger(__name__)

# (channel, event id) of each message, in the order they were published; a coroutine
# function is awaited before the next message is read.
OnMessage = Callable[[str, str], Awaitable[None] | None]


async def listen(
    redis: RedisCluster, channels: Sequence[str], on_message: OnMessage, stop: asyncio.Event
) -> None:
    """Call `on_message` for each message on `channels` until `stop` is set.

    Polls with a timeout and checks `stop` rather than relying on cancellation: redis-py's
    pubsub reader can swallow a CancelledError and keep waiting. An error raised by
    `on_message` is handled as a lost connection: logged, then a reconnect.
    """
    while not stop.is_set():
        node = redis.get_random_node()
        client = Redis(host=node.host, port=int(node.port))
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(*channels)
            while not stop.is_set():
                message = await pubsub.get_message(timeout=0.5)
                if message is None or message["type"] != "message":
                    continue
                handled = on_message(message["channel"].decode(), message["data"].decode())
                if inspect.isawaitable(handled):
                    await handled
        except Exception as exc:  # noqa: BLE001 - logged; the caller's other source covers the gap
            logger.warning("channel listener on %s lost: %r; reconnecting", node.name, exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
                await client.aclose()
