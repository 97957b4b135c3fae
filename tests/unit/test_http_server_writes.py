"""One write per answer: HeadWithBodyTransport, alone and inside a real uvicorn server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import uvicorn
from flashcoupon_common.httpserver import HeadWithBodyTransport, ServerTimeouts, server_options
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.support.polling import wait_until
from tests.support.ports import free_port


class _Recorder:
    """The connection's write side, recording each write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


async def test_the_head_goes_out_with_the_body_in_one_write() -> None:
    wire = _Recorder()
    t = HeadWithBodyTransport(wire, asyncio.get_running_loop())
    t.write(b"HTTP/1.1 410 Gone\r\ncontent-length: 2\r\n\r\n")
    t.write(b"{}")
    assert wire.writes == [b"HTTP/1.1 410 Gone\r\ncontent-length: 2\r\n\r\n{}"]
    await asyncio.sleep(0)  # the fallback callback finds nothing held
    assert len(wire.writes) == 1


async def test_a_head_without_a_body_write_leaves_in_the_same_loop_turn() -> None:
    wire = _Recorder()
    t = HeadWithBodyTransport(wire, asyncio.get_running_loop())
    t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")  # a HEAD answer: no body write
    assert wire.writes == []
    await asyncio.sleep(0)
    assert wire.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"]
    t.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # informational: never held
    assert wire.writes[-1] == b"HTTP/1.1 100 Continue\r\n\r\n"
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    t.close()  # closing sends what is held first
    assert wire.writes[-1] == b"HTTP/1.1 200 OK\r\n\r\n" and wire.closed
    assert t.is_closing()  # everything else is the connection's own


_RELEASE: list[asyncio.Event] = []  # the stream's first chunk waits for the test


async def _stream() -> AsyncIterator[bytes]:
    await _RELEASE[0].wait()
    yield b"first\n"


async def _small(request: Request) -> Response:
    return Response(b'{"ok":true}', media_type="application/json")


async def _echo(request: Request) -> Response:
    return Response(await request.body())


async def _streamed(request: Request) -> Response:
    return StreamingResponse(_stream(), media_type="text/plain")


async def _exchange(port: int, raw: bytes, until: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        got = b""
        async with asyncio.timeout(10):
            while until not in got:
                chunk = await reader.read(65536)
                assert chunk, got
                got += chunk
        return got
    finally:
        writer.close()


async def test_a_real_server_answers_heads_streams_continues_and_keep_alives() -> None:
    app = Starlette(
        routes=[
            Route("/small", _small, methods=["GET", "HEAD"]),
            Route("/echo", _echo, methods=["POST"]),
            Route("/stream", _streamed),
        ]
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, **server_options("t", ServerTimeouts()))
    )
    task = asyncio.create_task(server.serve())
    try:
        await wait_until(lambda: server.started, 10, 0.05, what="uvicorn started")
        two = b"GET /small HTTP/1.1\r\nHost: t\r\n\r\n" * 2  # keep-alive, pipelined
        got = await _exchange(port, two, b'{"ok":true}HTTP/1.1 200')
        assert got.count(b'{"ok":true}') in (1, 2)
        head = await _exchange(port, b"HEAD /small HTTP/1.1\r\nHost: t\r\n\r\n", b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"content-length: 11" in head
        # A stream's head reaches the client before its first chunk exists.
        _RELEASE[:] = [asyncio.Event()]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
        async with asyncio.timeout(10):
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            _RELEASE[0].set()
            assert b"first" in await reader.readuntil(b"first\n")
        writer.close()
        # 100 Continue reaches a client that waits for it before sending the body.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"
        )
        async with asyncio.timeout(10):
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
            writer.write(b"ping")
            answer = await reader.readuntil(b"ping")
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200")
    finally:
        server.should_exit = True
        await task
