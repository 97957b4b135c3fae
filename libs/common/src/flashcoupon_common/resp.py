"""RESP on the wire, for the batcher's own node connections (redis_batch.py).

The batcher writes RESP itself and parses replies with hiredis: redis-py's per-command packing
and per-reply reading cost more CPU than the whole HTTP request around them. Error replies are
parsed into redis-py's own exception classes, by redis-py's private `BaseParser.parse_error`
(redis pinned <9 for it; tests/unit/test_redis_batch_errors.py checks the mapping).
"""

from __future__ import annotations

import asyncio
from typing import Any

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


class NodeConnection:
    """One connection to one node: raw asyncio streams and a hiredis reply parser."""

    __slots__ = ("parser", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.parser = make_reader()

    @classmethod
    async def open(cls, host: str, port: int) -> NodeConnection:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        return cls(reader, writer)

    async def roundtrip(self, payload: bytes, expected: int) -> list[Any]:
        self.writer.write(payload)
        replies: list[Any] = []
        parser = self.parser
        while True:
            reply = parser.gets()
            while reply is not False:
                replies.append(reply)
                if len(replies) == expected:
                    return replies
                reply = parser.gets()
            data = await self.reader.read(1 << 16)
            if not data:
                raise RedisConnectionError("connection closed by the server")
            parser.feed(data)

    def close(self) -> None:
        self.writer.close()
