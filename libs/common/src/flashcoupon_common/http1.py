"""The HTTP/1.1 wire, written once: request bytes, response parsing, one keep-alive connection.

Why not httpx: per request httpx/httpcore costs more CPU than everything else the gateway does
to forward a press, and ~10x what the load driver may spend (docs/loadtest.md). Our peers are
our own uvicorn servers (Content-Length or chunked bodies, keep-alive), so a minimal client
suffices. Its two users keep their own policy on top: the gateway's pool (flashcoupon_gateway.
pool: LIFO reuse, expiry, which requests may be retried) and the load driver
(flashcoupon_loadtest.http1: target URLs, reconnect-and-retry, SSE streams).

Nothing unchecked is written: the method must be a token, the path visible ASCII, header names
tokens, and header values free of control characters (`UnsafeRequestError` otherwise, before
any byte is sent). A CR or LF from a client's input could otherwise end the request line or a
header early and smuggle a second request or header to the upstream. Header values are sent
as UTF-8, so a user id crosses to the issuer byte-exact whatever its script (the issuer and
the wallet decode X-Flashcoupon-User as UTF-8: flashcoupon_common.http.user_from_header).

The subtle part is the connection's state after an error. Anything but a complete keep-alive
answer (an error, a timeout or cancellation mid-answer) leaves the byte stream out of step, so
the connection closes itself and `open` turns False; a caller reuses a connection only while
`open`. A connection that ends before the first answer byte raises `StaleConnectionError`
instead: a keep-alive connection the server dropped while idle, where the request was never
read — whether to send it again is the caller's decision.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Self

# (status, raw head, headers as (lowercase name, value) pairs, body)
Response = tuple[int, bytes, list[tuple[bytes, bytes]], bytes]


class ProtocolError(Exception):
    """The connection failed, or the answer is not HTTP/1.1 we understand."""


class StaleConnectionError(ProtocolError):
    """The connection ended before the first answer byte: the request was never read."""


class UnsafeRequestError(ValueError):
    """A request that cannot be written as given (control bytes, not a token, ...)."""

    def __init__(self, where: str) -> None:
        super().__init__(f"{where} contains characters that cannot be forwarded")
        self.where = where


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token
_PATH = re.compile(r"/[\x21-\x7e]*")  # visible ASCII: no blank, control or non-ASCII byte
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # CR, LF, NUL, tab ... and DEL
_WIRE_ERRORS = (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError)


def request_head(method: str, path: str, host: str, headers: Mapping[str, str]) -> bytes:
    """The request line and headers (no Content-Length, no blank line), or UnsafeRequestError."""
    return request_line(method, path, host) + header_lines(headers)


def request_line(method: str, path: str, host: str) -> bytes:
    """The request line and the Host header, or UnsafeRequestError."""
    if not _TOKEN.fullmatch(method):
        raise UnsafeRequestError("the method")
    if not _PATH.fullmatch(path):
        raise UnsafeRequestError("the path")
    return f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n".encode("ascii")


def header_lines(headers: Mapping[str, str]) -> bytes:
    """`headers` as header lines, each ending in CRLF, or UnsafeRequestError."""
    lines = []
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            raise UnsafeRequestError("a header name")
        check_header_value(name, value)
        try:
            lines.append(f"{name}: {value}\r\n".encode())
        except UnicodeEncodeError:  # a lone surrogate: no UTF-8 for it
            raise UnsafeRequestError(f"header {name}") from None
    return b"".join(lines)


def check_header_value(name: str, value: str) -> None:
    """UnsafeRequestError when `value` holds a control character (CR, LF, tab, NUL, DEL)."""
    if _CONTROL.search(value):
        raise UnsafeRequestError(f"header {name}")


def build_request(
    method: str, path: str, host: str, headers: Mapping[str, str], body: bytes | None
) -> bytes:
    """The whole request, ready to write. `body=None` sends no Content-Length at all."""
    head = request_head(method, path, host, headers)
    if body is None:
        return head + b"\r\n"
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def parse_head(head: bytes) -> tuple[int, list[tuple[bytes, bytes]]]:
    """(status, headers) from a response head ending in a blank line; names lowercased."""
    lines = head[:-4].split(b"\r\n")
    status = int(lines[0][9:12])
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers.append((name.strip().lower(), value.strip()))
    return status, headers


async def read_chunk(reader: asyncio.StreamReader) -> bytes:
    """One chunk of a chunked body; b"" once the last chunk (and its blank line) is read."""
    size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
    if size == 0:
        await reader.readuntil(b"\r\n")  # no trailers from our servers
        return b""
    return (await reader.readexactly(size + 2))[:-2]


class Connection:
    """One HTTP/1.1 connection: an exchange at a time, kept alive while the server allows."""

    __slots__ = ("open", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.open = True

    @classmethod
    async def connect(
        cls, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None
    ) -> Self:
        """Raises OSError as asyncio does; callers word connect failures their own way."""
        reader, writer = await asyncio.open_connection(host, port, ssl=ssl_context, limit=1 << 20)
        return cls(reader, writer)

    def stale(self) -> bool:
        """The server closed it, or it was closed here: do not send on it."""
        return not self.open or self.reader.at_eof() or self.writer.is_closing()

    def close(self) -> None:
        self.open = False
        self.writer.close()

    async def exchange(self, raw: bytes) -> Response:
        """Write a built request and read the whole answer.

        Raises StaleConnectionError (no answer byte came) or ProtocolError; after either, and
        after cancellation, the connection is closed. It is also closed after an answer that
        says `Connection: close` or whose body ends at the server's close.
        """
        self.send(raw)
        return await self.answer()

    def send(self, raw: bytes) -> None:
        """Write a built request in this loop turn (`exchange`'s first half, for a caller that
        must have it on the wire before its own task could run); then `answer`."""
        try:
            self.writer.write(raw)
        except _WIRE_ERRORS as exc:
            self.close()
            raise ProtocolError(f"{type(exc).__name__}: {exc}") from None

    async def answer(self) -> Response:
        """The whole answer to the request `send` wrote, as `exchange` reads it."""
        try:
            try:
                head = await self.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    raise StaleConnectionError("closed by the server before answering") from None
                raise
            except ConnectionResetError as exc:
                raise StaleConnectionError(f"reset before answering: {exc}") from None
            status, headers = parse_head(head)
            found = dict(headers)
            if b"content-length" in found:
                body = await self.reader.readexactly(int(found[b"content-length"]))
            elif found.get(b"transfer-encoding") == b"chunked":
                parts = []
                while chunk := await read_chunk(self.reader):
                    parts.append(chunk)
                body = b"".join(parts)
            else:
                body = await self.reader.read()  # no length: the body ends at close
                self.close()
                return status, head, headers, body
        except StaleConnectionError:
            self.close()
            raise
        except _WIRE_ERRORS as exc:
            self.close()
            raise ProtocolError(f"{type(exc).__name__}: {exc}") from None
        except BaseException:
            self.close()  # cancelled or timed out mid-answer: the stream is out of step
            raise
        if found.get(b"connection") == b"close":
            self.close()
        return status, head, headers, body

    async def stream(self, raw: bytes) -> AsyncIterator[tuple[int, bytes, bytes]]:
        """Send a request whose answer streams (SSE): yields (status, head, chunk) per chunk.

        A non-chunked answer is yielded whole, once. The connection is closed afterwards,
        because a stream abandoned half-way cannot be reused.
        """
        try:
            self.writer.write(raw)
            head = await self.reader.readuntil(b"\r\n\r\n")
            status, headers = parse_head(head)
            found = dict(headers)
            if found.get(b"transfer-encoding") == b"chunked":
                while chunk := await read_chunk(self.reader):
                    yield status, head, chunk
            else:
                length = found.get(b"content-length")
                body = await (
                    self.reader.readexactly(int(length))
                    if length is not None
                    else self.reader.read()
                )
                yield status, head, body
        except _WIRE_ERRORS as exc:
            raise ProtocolError(f"{type(exc).__name__}: {exc}") from None
        finally:
            self.close()
