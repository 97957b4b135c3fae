"""A small keep-alive HTTP/1.1 connection pool for the gateway's upstream calls.

Why not httpx: profiling the gateway showed httpx/httpcore spending more CPU per forwarded
request than everything else the gateway does together (pool bookkeeping, async-library
detection on every call), capping a process at a few hundred forwards per second on a busy
2-core machine. The upstreams are our own services (uvicorn: Content-Length or chunked bodies,
keep-alive), so a minimal client suffices: bounded connections per upstream, idle connections
reused LIFO and dropped before the server's keep-alive timeout, one deadline per request.

A request that fails on a reused connection before any answer byte arrived is retried once on
a fresh connection only if it is safe to repeat (GET, or a POST carrying an Idempotency-Key);
otherwise the error surfaces (the caller answers 503), because the upstream may have acted.

Nothing unchecked is written: the method must be a token, the path visible ASCII, header names
tokens, and header values free of control characters (`UnsafeRequestError` otherwise, before
any byte is sent). A CR or LF from a client's input could otherwise end the request line or a
header early and smuggle a second request or header to the upstream. Header values are sent
as UTF-8, so a user id crosses to the issuer byte-exact whatever its script (the issuer and
the wallet decode X-Flashcoupon-User as UTF-8: flashcoupon_common.http.user_from_header).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit


class UpstreamError(Exception):
    """Connection refused/reset, or an answer that is not HTTP/1.1 we understand."""


class UnsafeRequestError(ValueError):
    """A request that cannot be written as given (control bytes, not a token, ...)."""

    def __init__(self, where: str) -> None:
        super().__init__(f"{where} contains characters that cannot be forwarded")
        self.where = where


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token
_PATH = re.compile(r"/[\x21-\x7e]*")  # visible ASCII: no blank, control or non-ASCII byte
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # CR, LF, NUL, tab ... and DEL


def request_head(method: str, path: str, host: str, headers: Mapping[str, str]) -> bytes:
    """The request line and headers (no Content-Length), or UnsafeRequestError."""
    if not _TOKEN.fullmatch(method):
        raise UnsafeRequestError("the method")
    if not _PATH.fullmatch(path):
        raise UnsafeRequestError("the path")
    lines = [f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n".encode("ascii")]
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            raise UnsafeRequestError("a header name")
        if _CONTROL.search(value):
            raise UnsafeRequestError(f"header {name}")
        try:
            lines.append(f"{name}: {value}\r\n".encode())
        except UnicodeEncodeError:  # a lone surrogate: no UTF-8 for it
            raise UnsafeRequestError(f"header {name}") from None
    return b"".join(lines)


@dataclass(slots=True)
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float

    def usable(self, now: float, expiry: float) -> bool:
        return (
            now - self.idle_since < expiry
            and not self.reader.at_eof()
            and not self.writer.is_closing()
        )

    def close(self) -> None:
        self.writer.close()


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
        self._idle: deque[_Conn] = deque()
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
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """(status, headers as lowercase-name pairs, body).

        Raises UnsafeRequestError (nothing was sent), UpstreamError or TimeoutError.
        """
        head = request_head(method, path, self._host, headers)
        raw = head + b"Content-Length: %d\r\n\r\n" % len(body or b"") + (body or b"")
        retry_safe = method == "GET" or any(k.lower() == "idempotency-key" for k in headers)
        async with asyncio.timeout(deadline_seconds), self._slots:
            conn, reused = await self._acquire()
            try:
                return await self._exchange(conn, raw)
            except _NothingReceivedError:
                if not (reused and retry_safe):
                    raise UpstreamError("connection closed before an answer") from None
            conn, _ = await self._acquire(fresh=True)
            try:
                return await self._exchange(conn, raw)
            except _NothingReceivedError:
                raise UpstreamError("connection closed before an answer") from None

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def _acquire(self, fresh: bool = False) -> tuple[_Conn, bool]:
        now = time.monotonic()
        while self._idle and not fresh:
            conn = self._idle.pop()  # LIFO: the most recently used is the least likely stale
            if conn.usable(now, self._expiry):
                return conn, True
            conn.close()
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
        except OSError as exc:
            raise UpstreamError(f"connect to {self.host}:{self.port}: {exc}") from None
        return _Conn(reader, writer, now), False

    async def _exchange(
        self, conn: _Conn, raw: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        ok = False
        try:
            conn.writer.write(raw)
            try:
                head = await conn.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    raise _NothingReceivedError from None
                raise
            except ConnectionResetError:
                raise _NothingReceivedError from None
            lines = head[:-4].split(b"\r\n")
            status = int(lines[0][9:12])
            headers = []
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                headers.append((name.strip().lower(), value.strip()))
            found = dict(headers)
            if b"content-length" in found:
                body = await conn.reader.readexactly(int(found[b"content-length"]))
            elif found.get(b"transfer-encoding") == b"chunked":
                body = await self._chunked(conn.reader)
            else:
                body = await conn.reader.read()  # the body ends when the server closes
                return status, headers, body
            ok = found.get(b"connection") != b"close"
            return status, headers, body
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            raise UpstreamError(f"{type(e).__name__}: {e}") from None
        finally:
            # Anything but a complete keep-alive answer (errors, timeouts, cancellation) leaves
            # the stream out of step: that connection is closed, never reused.
            if ok:
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
            else:
                conn.close()

    @staticmethod
    async def _chunked(reader: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append((await reader.readexactly(size + 2))[:-2])


class _NothingReceivedError(Exception):
    """The connection ended before the first answer byte (a stale keep-alive connection)."""
