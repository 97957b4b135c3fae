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
        # The deadline of the request in flight (loop time) and the alarm that enforces it
        # (`_watch`): set once per timeout's length, not once per request.
        self._due: float | None = None
        self._alarm: asyncio.TimerHandle | None = None
        self.expired = False  # the last request's deadline passed

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
        if self._alarm is not None:
            self._alarm.cancel()
            self._alarm = None

    async def request(
        self,
        raw: bytes,
        timeout: float | None = None,  # noqa: ASYNC109 - an alarm, not asyncio.timeout: below
    ) -> tuple[int, bytes, bytes]:
        """Send pre-built bytes; return (status, head, body). Closes the connection on error.

        A kept-alive connection the server closed while idle (uvicorn drops idle connections
        after 5 s) fails before any answer byte; like browsers and urllib3, the request is then
        sent once more on a new connection — it was never read, and ours carry
        Idempotency-Keys anyway.

        With `timeout`, an answer not complete within that many seconds (connecting included)
        raises TimeoutError, and the connection is closed: what a client does with a late
        answer, the stream being out of step. The deadline is kept by the connection's alarm
        (`_watch`), which closes the connection, not by asyncio.timeout around the exchange
        nor a timer per request: those cost the driver ~8 and ~4.5 us a request, and a
        benchmark counts the driver's CPU against the server it measures (the hello-world
        baseline's GETs carry no deadline).
        """
        if timeout is None:
            return await self._send(raw, None)
        when = self._watch(timeout)
        try:
            return await self._send(raw, when)
        except ProtocolError:
            if self.expired:
                raise TimeoutError(f"no complete answer within {timeout}s") from None
            raise
        finally:
            self._due = None

    def _watch(self, timeout: float) -> float:
        """Start the request's deadline; its time (loop time).

        The alarm is set only when none is set for this deadline or sooner: answered requests
        leave it set, and when it goes off it is set again for the request then in flight. So
        a busy connection's alarm goes off about once per `timeout`, not once per request."""
        loop = asyncio.get_running_loop()
        when = self._due = loop.time() + timeout
        self.expired = False
        if self._alarm is None or when < self._alarm.when():
            self._set_alarm(loop, when)
        return when

    def _set_alarm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._alarm is not None:
            self._alarm.cancel()
        self._alarm = loop.call_at(when, self._alarm_off, loop)

    def _alarm_off(self, loop: asyncio.AbstractEventLoop) -> None:
        self._alarm = None
        due = self._due
        if due is None:
            return  # idle: the next request sets it again
        if due > loop.time():
            self._set_alarm(loop, due)  # a later request than the one it was set for
            return
        # Past its deadline: closed, the exchange fails and `request` raises TimeoutError.
        self._due, self.expired = None, True
        if self._conn is not None:
            self._conn.close()

    async def _send(self, raw: bytes, when: float | None) -> tuple[int, bytes, bytes]:
        conn = self._conn
        reused = conn is not None and conn.open
        if not reused:  # checked here, not in connect(): no extra await per request
            conn = await self._connect_by(when)
        assert conn is not None
        try:
            status, head, _, body = await conn.exchange(raw)
        except StaleConnectionError:
            if not reused or (when is not None and self.expired):
                raise  # a new connection's failure, or the deadline closed this one
            status, head, _, body = await (await self._connect_by(when)).exchange(raw)
        return status, head, body

    async def _connect_by(self, when: float | None) -> http1.Connection:
        async with asyncio.timeout_at(when):
            return await self.connect()

    async def stream(self, raw: bytes) -> AsyncIterator[tuple[int, bytes, bytes]]:
        """Send a request whose answer streams (SSE): yields (status, head, chunk) per chunk.

        A non-chunked answer is yielded whole, once. The connection is closed afterwards,
        because a stream abandoned half-way cannot be reused.
        """
        async for part in (await self.connect()).stream(raw):
            yield part
