"""A minimal keep-alive HTTP/1.1 client over asyncio streams, for the load driver.

Why not httpx: per request httpx costs ~10x the CPU of writing pre-built bytes and parsing
a status line, and on a 2-core machine the driver must not become the bottleneck it measures
(docs/loadtest.md has the figures). Requests are built once, before the clock starts, and the
response parser handles exactly what our servers send: Content-Length bodies, chunked bodies
(SSE, streaming) and `Connection: close`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit


class ProtocolError(Exception):
    """The server's answer is not HTTP/1.1 we understand, or it closed mid-answer."""


class _Stale(Exception):
    """The connection was closed before any byte of the answer: safe to send again."""


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
    lines = [f"{method} {target.prefix}{path} HTTP/1.1", f"Host: {target.host_header}"]
    lines.extend(f"{k}: {v}" for k, v in (headers or {}).items())
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def header_value(head: bytes, name: bytes) -> bytes | None:
    """A response header's value from the raw head (name lowercase, without the colon)."""
    lower = head.lower()
    i = lower.find(b"\r\n" + name + b":")
    if i < 0:
        return None
    start = i + len(name) + 3
    end = head.find(b"\r\n", start)
    return head[start : end if end >= 0 else len(head)].strip()


class Connection:
    """One keep-alive connection; reconnects lazily after the server closed it."""

    def __init__(self, target: Target, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self.target = target
        self._ssl = ssl_context
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        if self._writer is not None:
            return
        ctx = self._ssl
        if self.target.scheme == "https" and ctx is None:
            ctx = ssl.create_default_context()
        self._reader, self._writer = await asyncio.open_connection(
            self.target.host, self.target.port, ssl=ctx, limit=1 << 20
        )

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def request(self, raw: bytes) -> tuple[int, bytes, bytes]:
        """Send pre-built bytes; return (status, head, body). Closes the connection on error.

        A kept-alive connection the server closed while idle (uvicorn drops idle connections
        after 5 s) fails before any answer byte; like browsers and urllib3, the request is then
        sent once more on a new connection — it was never read, and ours carry
        Idempotency-Keys anyway.
        """
        reused = self._writer is not None
        try:
            return await self._exchange(raw)
        except _Stale as exc:
            if not reused:
                raise ProtocolError(str(exc)) from None
        return await self._exchange(raw)

    async def _exchange(self, raw: bytes) -> tuple[int, bytes, bytes]:
        if self._writer is None:
            await self.connect()
        assert self._reader is not None and self._writer is not None
        try:
            try:
                self._writer.write(raw)
                head = await self._reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as e:
                if not e.partial:
                    raise _Stale("closed by the server before answering") from None
                raise
            except ConnectionResetError as e:
                raise _Stale(f"reset before answering: {e}") from None
            status = int(head[9:12])
            length = header_value(head, b"content-length")
            if length is not None:
                body = await self._reader.readexactly(int(length))
            elif header_value(head, b"transfer-encoding") == b"chunked":
                body = b"".join([chunk async for chunk in self._chunks()])
            else:
                body = await self._reader.read()  # no length: the body ends at close
                self.close()
                return status, head, body
        except _Stale:
            self.close()
            raise
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            self.close()
            raise ProtocolError(f"{type(e).__name__}: {e}") from None
        except BaseException:
            self.close()  # cancelled or timed out mid-answer: the stream is out of step
            raise
        if header_value(head, b"connection") == b"close":
            self.close()
        return status, head, body

    async def stream(self, raw: bytes) -> AsyncIterator[tuple[int, bytes, bytes]]:
        """Send a request whose answer streams (SSE): yields (status, head, chunk) per chunk.

        A non-chunked answer is yielded whole, once. The connection is closed afterwards,
        because a stream abandoned half-way cannot be reused.
        """
        await self.connect()
        assert self._reader is not None and self._writer is not None
        try:
            self._writer.write(raw)
            head = await self._reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            if header_value(head, b"transfer-encoding") == b"chunked":
                async for chunk in self._chunks():
                    yield status, head, chunk
            else:
                length = header_value(head, b"content-length")
                body = await (
                    self._reader.readexactly(int(length))
                    if length is not None
                    else self._reader.read()
                )
                yield status, head, body
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            raise ProtocolError(f"{type(e).__name__}: {e}") from None
        finally:
            self.close()

    async def _chunks(self) -> AsyncIterator[bytes]:
        assert self._reader is not None
        while True:
            size_line = await self._reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                await self._reader.readuntil(b"\r\n")  # no trailers from our servers
                return
            chunk = await self._reader.readexactly(size + 2)
            yield chunk[:-2]
