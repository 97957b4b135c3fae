"""The load driver's HTTP/1.1 client: target URLs and a connection that reconnects by itself.

The wire (request bytes, response parsing, keep-alive) is flashcoupon_common.http1, shared with
the gateway. What is the driver's own: requests are built once, before the clock starts, for a
`Target` (an ingress may add a path prefix, https is allowed), and a connection the server
dropped while idle is opened again, and the request sent once more, without the scenario
noticing.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from flashcoupon_common import http1
from flashcoupon_common.http1 import ProtocolError, StaleConnectionError

__all__ = ["Connection", "ProtocolError", "Target", "build_request", "request_line"]


@dataclass(frozen=True, slots=True)
class Target:
    """Where requests go: scheme, host, port and a path prefix (an ingress may add one)."""

    scheme: str
    host: str
    port: int
    prefix: str = ""

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"target must be http(s)://host[:port][/prefix], got {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"


def build_request(
    target: Target,
    method: str,
    path: str,
    headers: Mapping[str, str] | None = None,
    body: bytes = b"",
) -> bytes:
    """The request's bytes, ready to write; built ahead so the hot loop only writes."""
    sized = body or method in ("POST", "PUT", "PATCH")
    return http1.build_request(
        method, target.prefix + path, target.host_header, headers or {}, body if sized else None
    )


@functools.cache
def request_line(target: Target, method: str, path: str) -> bytes:
    """The request line and Host header for `target`: a scenario whose requests differ only
    in their headers writes this, then their pre-built header lines (http1.header_lines)."""
    return http1.request_line(method, target.prefix + path, target.host_header)


class Connection:
    """One keep-alive connection to a target; reconnects lazily after the server closed it."""

    def __init__(self, target: Target, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self.target = target
        self._ssl = ssl_context
        self._conn: http1.Connection | None = None

    async def connect(self) -> http1.Connection:
        if self._conn is None or not self._conn.open:
            self._conn = await self._open()
        return self._conn

    async def _open(self) -> http1.Connection:
        ctx = self._ssl
        if self.target.scheme == "https" and ctx is None:
            ctx = ssl.create_default_context()
        try:
            return await http1.Connection.connect(
                self.target.host, self.target.port, ssl_context=ctx
            )
        except OSError as exc:
            # A refused or unreachable connect is an answer the shopper did not get, like a
            # dropped connection: scenarios record it, the worker does not die of it (a pod
            # force-deleted mid-burst leaves a NodePort refusing until its endpoints update).
            raise ProtocolError(
                f"cannot connect to {self.target.host}:{self.target.port}: {exc}"
            ) from exc

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    async def request(
        self,
        raw: bytes,
        timeout: float | None = None,  # noqa: ASYNC109 - a timer, not asyncio.timeout: see below
    ) -> tuple[int, bytes, bytes]:
        """Send pre-built bytes; return (status, head, body). Closes the connection on error.

        A kept-alive connection the server closed while idle (uvicorn drops idle connections
        after 5 s) fails before any answer byte; like browsers and urllib3, the request is then
        sent once more on a new connection — it was never read, and ours carry
        Idempotency-Keys anyway.

        With `timeout`, an answer not complete within that many seconds (connecting included)
        raises TimeoutError, and the connection is closed: what a client does with a late
        answer, the stream being out of step. The deadline is one timer that closes the
        connection, not asyncio.timeout around the exchange, which costs the driver ~3x the
        CPU (~8 against ~2.5 us a request) that a benchmark would count against the server it
        measures.
        """
        if timeout is None:
            return await self._send(raw, None)
        deadline = _Deadline(self, timeout)
        try:
            return await self._send(raw, deadline)
        except ProtocolError:
            if deadline.expired:
                raise TimeoutError(f"no complete answer within {timeout}s") from None
            raise
        finally:
            deadline.cancel()

    async def _send(self, raw: bytes, deadline: _Deadline | None) -> tuple[int, bytes, bytes]:
        conn = self._conn
        reused = conn is not None and conn.open
        if not reused:  # checked here, not in connect(): no extra await per request
            conn = await self._connect_by(deadline)
        assert conn is not None
        try:
            status, head, _, body = await conn.exchange(raw)
        except StaleConnectionError:
            if not reused or (deadline is not None and deadline.expired):
                raise  # a new connection's failure, or the deadline closed this one
            status, head, _, body = await (await self._connect_by(deadline)).exchange(raw)
        return status, head, body

    async def _connect_by(self, deadline: _Deadline | None) -> http1.Connection:
        async with asyncio.timeout_at(deadline.when if deadline is not None else None):
            return await self.connect()

    async def stream(self, raw: bytes) -> AsyncIterator[tuple[int, bytes, bytes]]:
        """Send a request whose answer streams (SSE): yields (status, head, chunk) per chunk.

        A non-chunked answer is yielded whole, once. The connection is closed afterwards,
        because a stream abandoned half-way cannot be reused.
        """
        async for part in (await self.connect()).stream(raw):
            yield part


class _Deadline:
    """A request's deadline: when it passes, the connection in use is closed (its exchange
    then fails, and `request` turns that into TimeoutError)."""

    __slots__ = ("_timer", "expired", "when")

    def __init__(self, connection: Connection, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        self.when = loop.time() + timeout
        self.expired = False
        self._timer = loop.call_at(self.when, self._expire, connection)

    def _expire(self, connection: Connection) -> None:
        self.expired = True
        if connection._conn is not None:
            connection._conn.close()

    def cancel(self) -> None:
        self._timer.cancel()
