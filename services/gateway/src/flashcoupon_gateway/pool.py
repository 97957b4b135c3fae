"""A small keep-alive HTTP/1.1 connection pool for the gateway's upstream calls.

The wire (request bytes with their safety checks, response parsing, when a connection may be
reused) is flashcoupon_common.http1; this module is the pooling policy on top: bounded
connections per upstream, idle connections reused LIFO and dropped before the server's
keep-alive timeout, one deadline per request. The upstreams are our own services (uvicorn).

`send_now` writes a request in the caller's loop turn on an idle connection (the issue batcher:
the issuer starts on a batch while the gateway reads the next presses) and `answer` reads its
answer later, under the same rules as `request`.

A request that fails on a reused connection before any answer byte arrived is retried once on
a fresh connection only if it is safe to repeat (GET, or a POST carrying an Idempotency-Key);
otherwise the error surfaces (the caller answers 503), because the upstream may have acted.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from flashcoupon_common.http1 import (
    Connection,
    ProtocolError,
    Response,
    StaleConnectionError,
    UnsafeRequestError,
    build_request,
)


class _Pooled(Connection):
    __slots__ = ("idle_since",)  # set on release: no allocation per request

    idle_since: float


class _Slots:
    """At most `n` requests at once, waiters served in order: asyncio.Semaphore, plus
    `take_now`, which it lacks (a caller writing in this loop turn cannot wait)."""

    def __init__(self, n: int) -> None:
        self.free = n
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take_now(self) -> bool:
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return True
        return False

    async def take(self) -> None:
        if self.take_now():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed a slot as the caller went away: pass it on
            raise

    def give(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():  # a cancelled waiter is skipped
                waiter.set_result(None)
                return
        self.free += 1


@dataclass(slots=True)
class Sent:
    """A request `HTTPPool.send_now` wrote; `HTTPPool.answer` reads its answer."""

    conn: _Pooled
    raw: bytes
    retry_safe: bool


class HTTPPool:
    def __init__(
        self, base_url: str, *, max_connections: int = 100, keepalive_expiry: float = 2.0
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be http://host[:port], got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self._host = parts.netloc
        self._idle: deque[_Pooled] = deque()  # most recently used last
        self._busy: set[_Pooled] = set()  # written by send_now, answer not read yet
        self._slots = _Slots(max_connections)
        self._expiry = keepalive_expiry

    async def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None = None,
        *,
        deadline_seconds: float,
    ) -> Response:
        """(status, raw head, headers as lowercase-name pairs, body).

        Raises UnsafeRequestError (nothing was sent), ProtocolError or TimeoutError.
        """
        raw = build_request(method, path, self._host, headers, body or b"")
        async with asyncio.timeout(deadline_seconds):
            await self._slots.take()
            try:
                conn, reused = await self._acquire()
                conn.send(raw)
                return await self._answer(Sent(conn, raw, _retry_safe(method, headers)), reused)
            finally:
                self._slots.give()

    def send_now(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> Sent | None:
        """Write the request in this loop turn on an idle connection, so the upstream starts on
        it while the caller's turn goes on; `answer` reads the answer. None, with nothing
        written, when no idle connection is fresh, the pool is full or the request cannot be
        written as given: `request` then does it all (and raises what there is to raise)."""
        try:
            raw = build_request(method, path, self._host, headers, body or b"")
        except UnsafeRequestError:
            return None
        conn = self._idle_connection()
        if conn is None:
            return None
        if not self._slots.take_now():
            self._idle.append(conn)
            return None
        try:
            conn.send(raw)
        except ProtocolError:
            self._slots.give()  # closed by send: `request` opens another
            return None
        self._busy.add(conn)
        return Sent(conn, raw, _retry_safe(method, headers))

    async def answer(self, sent: Sent, *, deadline_seconds: float) -> Response:
        """The answer to a request `send_now` wrote: as `request` returns it and raises."""
        self._busy.discard(sent.conn)
        try:
            async with asyncio.timeout(deadline_seconds):
                return await self._answer(sent, reused=True)
        finally:
            self._slots.give()

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()
        for conn in self._busy:  # written, but the caller never came for the answer
            conn.close()
        self._busy.clear()

    async def _answer(self, sent: Sent, reused: bool) -> Response:
        conn = sent.conn
        try:
            response = await conn.answer()
        except StaleConnectionError:
            if not (reused and sent.retry_safe):
                raise ProtocolError("connection closed before an answer") from None
            conn, _ = await self._acquire(fresh=True)
            try:
                response = await conn.exchange(sent.raw)
            except StaleConnectionError:
                raise ProtocolError("connection closed before an answer") from None
        if conn.open:  # a complete keep-alive answer: the stream is in step
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        return response

    def _idle_connection(self) -> _Pooled | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()  # LIFO: the most recently used is the least likely stale
            if now - conn.idle_since < self._expiry and not conn.stale():
                return conn
            conn.close()
        return None

    async def _acquire(self, fresh: bool = False) -> tuple[_Pooled, bool]:
        conn = None if fresh else self._idle_connection()
        if conn is not None:
            return conn, True
        try:
            return await _Pooled.connect(self.host, self.port), False
        except OSError as exc:
            raise ProtocolError(f"connect to {self.host}:{self.port}: {exc}") from None


def _retry_safe(method: str, headers: Mapping[str, str]) -> bool:
    """Whether a request may be sent again after its connection closed before any answer
    byte: GET, or a POST carrying an Idempotency-Key."""
    return method == "GET" or any(k.lower() == "idempotency-key" for k in headers)
