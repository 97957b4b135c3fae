"""A small keep-alive HTTP/1.1 connection pool for the gateway's upstream calls.

The wire (request bytes with their safety checks, response parsing, when a connection may be
reused) is flashcoupon_common.http1; this module is the pooling policy on top: bounded
connections per upstream, idle connections reused LIFO and dropped before the server's
keep-alive timeout, one deadline per request. The upstreams are our own services (uvicorn).

A request that fails on a reused connection before any answer byte arrived is retried once on
a fresh connection only if it is safe to repeat (GET, or a POST carrying an Idempotency-Key);
otherwise the error surfaces (the caller answers 503), because the upstream may have acted.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from urllib.parse import urlsplit

from flashcoupon_common.http1 import (
    Connection,
    ProtocolError,
    Response,
    StaleConnectionError,
    build_request,
)


class _Pooled(Connection):
    __slots__ = ("idle_since",)  # set on release: no allocation per request

    idle_since: float


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
        self._slots = asyncio.Semaphore(max_connections)
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
        retry_safe = method == "GET" or any(k.lower() == "idempotency-key" for k in headers)
        async with asyncio.timeout(deadline_seconds), self._slots:
            conn, reused = await self._acquire()
            try:
                response = await conn.exchange(raw)
            except StaleConnectionError:
                if not (reused and retry_safe):
                    raise ProtocolError("connection closed before an answer") from None
                conn, _ = await self._acquire(fresh=True)
                try:
                    response = await conn.exchange(raw)
                except StaleConnectionError:
                    raise ProtocolError("connection closed before an answer") from None
            if conn.open:  # a complete keep-alive answer: the stream is in step
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
            return response

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def _acquire(self, fresh: bool = False) -> tuple[_Pooled, bool]:
        now = time.monotonic()
        while self._idle and not fresh:
            conn = self._idle.pop()  # LIFO: the most recently used is the least likely stale
            if now - conn.idle_since < self._expiry and not conn.stale():
                return conn, True
            conn.close()
        try:
            return await _Pooled.connect(self.host, self.port), False
        except OSError as exc:
            raise ProtocolError(f"connect to {self.host}:{self.port}: {exc}") from None
