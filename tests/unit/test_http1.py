"""The shared HTTP/1.1 wire (flashcoupon_common.http1), fed bytes through asyncio.StreamReader."""

from __future__ import annotations

import asyncio

import pytest
from flashcoupon_common.http1 import (
    Connection,
    ProtocolError,
    StaleConnectionError,
    UnsafeRequestError,
    build_request,
    parse_head,
    read_chunk,
)


class _Sink:
    """Stands in for the socket's write side: the bytes are only collected."""

    def __init__(self) -> None:
        self.sent = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def _reader(data: bytes, *, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


def _conn(data: bytes, *, eof: bool = True) -> tuple[Connection, _Sink]:
    sink = _Sink()
    return Connection(_reader(data, eof=eof), sink), sink  # type: ignore[arg-type]


def test_build_request_sizes_the_body_or_sends_no_length() -> None:
    assert build_request("POST", "/v1/x", "h:1", {"Idempotency-Key": "k"}, b"{}") == (
        b"POST /v1/x HTTP/1.1\r\nHost: h:1\r\nIdempotency-Key: k\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert build_request("GET", "/v1/x?a=1", "h", {}, b"") == (
        b"GET /v1/x?a=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"
    )
    assert build_request("GET", "/", "h", {}, None) == b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"


def test_build_request_checks_before_building() -> None:
    with pytest.raises(UnsafeRequestError, match="header x"):
        build_request("POST", "/v1/x", "h", {"x": "a\r\nHost: evil"}, b"")


def test_parse_head_lowercases_names_and_strips_values() -> None:
    head = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After:  3 \r\nContent-Length: 0\r\n\r\n"
    assert parse_head(head) == (429, [(b"retry-after", b"3"), (b"content-length", b"0")])


async def test_read_chunk_ignores_extensions_and_ends_on_the_zero_chunk() -> None:
    reader = _reader(b"5;name=v\r\nhello\r\nA\r\n0123456789\r\n0\r\n\r\nNEXT")
    assert await read_chunk(reader) == b"hello"
    assert await read_chunk(reader) == b"0123456789"
    assert await read_chunk(reader) == b""
    assert await reader.read() == b"NEXT"  # the terminating blank line was consumed


async def test_keep_alive_answers_in_sequence() -> None:
    conn, sink = _conn(
        b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}"
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    status, head, headers, body = await conn.exchange(b"A")
    assert (status, body, headers) == (201, b"{}", [(b"content-length", b"2")])
    assert head.startswith(b"HTTP/1.1 201 Created\r\n") and head.endswith(b"\r\n\r\n")
    assert (await conn.exchange(b"B"))[::3] == (200, b"hello world")
    assert sink.sent == b"AB"
    assert conn.open and not sink.closed


async def test_connection_close_or_a_body_ending_at_eof_closes_the_connection() -> None:
    conn, sink = _conn(b"HTTP/1.1 410 Gone\r\nConnection: close\r\ncontent-length: 1\r\n\r\nx")
    assert (await conn.exchange(b"A"))[::3] == (410, b"x")
    assert not conn.open and sink.closed and conn.stale()

    conn, sink = _conn(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
    assert (await conn.exchange(b"A"))[::3] == (200, b"until the end")
    assert not conn.open and sink.closed


async def test_no_answer_byte_is_a_stale_connection() -> None:
    conn, sink = _conn(b"")
    with pytest.raises(StaleConnectionError):
        await conn.exchange(b"A")
    assert not conn.open and sink.closed


async def test_a_partial_answer_is_a_protocol_error_not_a_stale_connection() -> None:
    for wire in (
        b"HTTP/1.1 200 OK\r\nContent-Le",  # the head cut short
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # the body cut short
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # not a chunk size
        b"HTTP/1.1 2xx OK\r\nContent-Length: 0\r\n\r\n",  # not a status
    ):
        conn, sink = _conn(wire)
        with pytest.raises(ProtocolError) as caught:
            await conn.exchange(b"A")
        assert not isinstance(caught.value, StaleConnectionError)
        assert not conn.open and sink.closed


async def test_cancelled_mid_answer_closes_the_connection() -> None:
    conn, sink = _conn(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nfive!", eof=False)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await conn.exchange(b"A")
    assert not conn.open and sink.closed  # the stream is out of step: never reused


async def test_a_server_closed_idle_connection_is_stale_before_sending() -> None:
    conn, _ = _conn(b"")  # EOF already received
    assert conn.stale()
    conn, _ = _conn(b"", eof=False)
    assert not conn.stale()


async def test_stream_yields_each_chunk_then_closes() -> None:
    conn, sink = _conn(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        b"10\r\nevent: position\n\r\n9\r\ndata: 3\n\n\r\n0\r\n\r\n"
    )
    got = [(status, chunk) async for status, _, chunk in conn.stream(b"GET")]
    assert got == [(200, b"event: position\n"), (200, b"data: 3\n\n")]
    assert sink.sent == b"GET" and not conn.open


async def test_stream_of_a_sized_answer_yields_it_whole() -> None:
    conn, _ = _conn(b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}")
    assert [(s, c) async for s, _, c in conn.stream(b"GET")] == [(404, b"{}")]
