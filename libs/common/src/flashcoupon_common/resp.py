"""RESP on the wire, for the batcher's own node connections (redis_batch.py).

The batcher writes RESP itself and parses replies with hiredis: redis-py's per-command packing
and per-reply reading cost more CPU than the whole HTTP request around them. Error replies are
parsed into redis-py's own exception classes, by redis-py's private `BaseParser.parse_error`
(redis pinned <9 for it; tests/unit/test_redis_batch_errors.py checks the mapping).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import hiredis
from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError

Arg = str | bytes | int | float


def bulk(value: Arg) -> bytes:
    raw = value if isinstance(value, bytes) else str(value).encode()
    return b"$%d\r\n%s\r\n" % (len(raw), raw)


def pack(*parts: Arg) -> bytes:
    """One command in RESP."""
    return b"*%d\r\n" % len(parts) + b"".join(bulk(p) for p in parts)


def make_reader() -> hiredis.Reader:
    """A RESP reader whose error replies are redis-py's exception classes (NoScriptError,
    MovedError, ...), so retries and redirects are decided as redis-py would."""
    return hiredis.Reader(replyError=BaseParser.parse_error)


class NodeConnection(asyncio.Protocol):
    """One connection to one node: a protocol that parses replies (hiredis) as they arrive.

    `roundtrip`'s `on_replies` is called from `data_received` itself, in the loop turn the
    last expected reply arrived in, so the batcher settles its calls' futures there and their
    callers resume in the next turn. With asyncio streams the reply first woke the batcher's
    task, which settled the futures a turn later: one loop turn more per Redis call, and under
    a crowd a turn is long (a gateway's presses waited for it twice per press).
    One round trip at a time.
    """

    def __init__(self) -> None:
        self.parser = make_reader()
        self.transport: asyncio.Transport | None = None
        self._lost: Exception | None = None
        self._waiter: asyncio.Future[list[Any]] | None = None
        self._on_replies: Callable[[list[Any]], None] | None = None
        self._expected = 0
        self._replies: list[Any] = []

    @classmethod
    async def open(cls, host: str, port: int) -> NodeConnection:
        _, conn = await asyncio.get_running_loop().create_connection(cls, host, port)
        return conn

    async def roundtrip(
        self,
        payload: bytes,
        expected: int,
        on_replies: Callable[[list[Any]], None] | None = None,
    ) -> list[Any]:
        """Send `payload`, return its `expected` replies (after `on_replies` saw them)."""
        return await self.replies(self.send(payload, expected, on_replies))

    def send(
        self,
        payload: bytes,
        expected: int,
        on_replies: Callable[[list[Any]], None] | None = None,
    ) -> asyncio.Future[list[Any]]:
        """Write `payload` in this loop turn; the future settles with its `expected` replies
        (after `on_replies` saw them). Await it with `replies`: `roundtrip` in two halves, for
        a caller that must put a batch on the wire before its own task could first run."""
        if self._lost is not None or self.transport is None or self.transport.is_closing():
            raise RedisConnectionError("connection closed by the server")
        waiter: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._waiter, self._on_replies = waiter, on_replies
        self._expected, self._replies = expected, []
        self.transport.write(payload)
        return waiter

    async def replies(self, waiter: asyncio.Future[list[Any]]) -> list[Any]:
        """The replies of `send`'s round trip; the connection takes another one after."""
        try:
            return await waiter
        finally:
            self._waiter = self._on_replies = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCP transport is not an asyncio.Transport subclass, but has its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.parser.feed(data)
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nobody waits (a cancelled round trip): the connection is being dropped
        replies = self._replies
        try:
            reply = self.parser.gets()
            while reply is not False:
                replies.append(reply)
                if len(replies) == self._expected:
                    waiter.set_result(replies)
                    if self._on_replies is not None:
                        self._on_replies(replies)
                    return
                reply = self.parser.gets()
        except Exception as exc:  # noqa: BLE001 - a reply hiredis cannot parse
            waiter.set_exception(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = RedisConnectionError(f"connection closed by the server: {exc!r}")
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(self._lost)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
