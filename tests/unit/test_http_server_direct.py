"""Direct answers (httpserver.DirectAnswer) inside a real uvicorn server.

An app with `direct_answer` answers some requests the moment their head is read, without
uvicorn's request cycle or its ASGI call. Every direct answer is compared byte for byte with the
same Reply sent through ASGI (the date header aside), and the connection's books are checked as
uvicorn keeps them: kept alive (its keep-alive timer armed, no read timer of the guard), closed
when asked, a pipelined ASGI request after a direct answer and a direct one behind an ASGI answer
in progress, a body left unread, requests the direct path must leave to ASGI."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest
import uvicorn
from flashcoupon_common.http import Reply
from flashcoupon_common.httpserver import whole_answer
from starlette.types import Receive, Scope, Send

from tests.support.polling import wait_until
from tests.support.raw_http import exchange, serving

_GONE = Reply.of(410, [(b"content-type", b"application/problem+json")], b'{"code":"SOLD_OUT"}')
_DATE = re.compile(rb"date: [^\r]*\r\n")


class _App:
    """Answers /direct/* directly (and through ASGI when asked there), /slow after a pause,
    anything else through ASGI; `asgi` lists the paths its ASGI call served."""

    def __init__(self) -> None:
        self.asgi: list[str] = []
        self.direct: list[tuple[str, str]] = []  # (method, path) asked

    def direct_answer(self, scope: Scope) -> Reply | None:
        self.direct.append((scope["method"], scope["path"]))
        if scope["path"].startswith("/direct/"):
            assert scope["headers"] and scope["state"] == {}  # the head's scope so far
            return _GONE if scope["path"] != "/direct/headless" else Reply(204, [], b"")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.asgi.append(scope["path"])
        if scope["path"] == "/slow":
            await asyncio.sleep(0.2)
        reply = _GONE if scope["path"] != "/direct/headless" else Reply(204, [], b"")
        await reply.send(send)


@pytest.fixture
async def served() -> AsyncIterator[tuple[_App, uvicorn.Server, int]]:
    app = _App()
    async with serving(app, timeout_keep_alive=2) as (server, port):
        yield app, server, port


def _request(
    path: str, *, close: bool = False, extra: bytes = b"", version: bytes = b"1.1"
) -> bytes:
    tail = b"Connection: close\r\n" if close else b""
    return b"POST %s HTTP/%s\r\nHost: t\r\n%s%s\r\n" % (path.encode(), version, tail, extra)


async def test_a_direct_answer_is_the_bytes_the_asgi_path_sends(
    served: tuple[_App, uvicorn.Server, int],
) -> None:
    app, _, port = served
    direct = await exchange(port, _request("/direct/x", close=True))
    assert app.asgi == [] and app.direct == [("POST", "/direct/x")]
    through_asgi = await exchange(port, _request("/asgi", close=True))
    assert app.asgi == ["/asgi"]
    assert direct.startswith(b"HTTP/1.1 410 Gone\r\n") and b"connection: close\r\n" in direct
    assert _DATE.sub(b"", direct) == _DATE.sub(b"", through_asgi)


async def test_requests_the_direct_path_leaves_to_asgi(
    served: tuple[_App, uvicorn.Server, int],
) -> None:
    """A query, a percent-encoded path, HTTP/1.0 and an answer whole_answer cannot write (a 204)
    are uvicorn's to shape: the ASGI call answers them."""
    app, _, port = served
    for target in ("/direct/x?a=1", "/direct/%78"):
        got = await exchange(port, _request(target, close=True))
        assert got.startswith(b"HTTP/1.1 410")
    got = await exchange(port, _request("/direct/x", version=b"1.0"))
    assert got.startswith(b"HTTP/1.1 410")
    got = await exchange(port, _request("/direct/headless", close=True))
    assert got.startswith(b"HTTP/1.1 204") and b"content-length" not in got
    assert app.asgi == ["/direct/x", "/direct/x", "/direct/x", "/direct/headless"]


async def test_pipelined_direct_and_asgi_answers_keep_their_order(
    served: tuple[_App, uvicorn.Server, int],
) -> None:
    """Direct answers and ASGI ones on one connection, in order, a direct answer's body left
    unread: requests pipelined behind an ASGI answer in progress are queued by uvicorn as
    before (the app is not asked for them: they are answered through ASGI, in order)."""
    app, _, port = served
    with_body = _request("/direct/b", extra=b"Content-Length: 5\r\n") + b"hello"
    raw = with_body + _request("/direct/a") + _request("/asgi") + _request("/direct/c", close=True)
    got = await exchange(port, raw)
    assert got.count(b"HTTP/1.1 410 Gone\r\n") == 4
    assert got.count(b"connection: close\r\n") == 1 and got.endswith(b'{"code":"SOLD_OUT"}')
    assert [path for _, path in app.direct] == ["/direct/b", "/direct/a", "/asgi"]
    assert app.asgi == ["/asgi", "/direct/c"]  # behind /asgi's task: queued by uvicorn

    app.asgi.clear()
    app.direct.clear()
    raw = _request("/slow") + _request("/direct/d") + _request("/direct/e", close=True)
    got = await exchange(port, raw)
    assert got.count(b"HTTP/1.1 410 Gone\r\n") == 3
    assert app.asgi == ["/slow", "/direct/d", "/direct/e"]
    assert app.direct == [("POST", "/slow")]


async def test_a_kept_alive_connection_is_bounded_by_the_keep_alive_alone(
    served: tuple[_App, uvicorn.Server, int],
) -> None:
    """After a direct answer the connection waits as after any answer: uvicorn's keep-alive
    timer armed, the guard's read timer not (one timer per idle connection), and closed by the
    keep-alive once idle; a next request on it is served first."""
    app, server, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for path in ("/direct/a", "/direct/b"):
            writer.write(_request(path))
            async with asyncio.timeout(10):
                head = await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(len(_GONE.body))
            assert head.startswith(b"HTTP/1.1 410") and b"connection: close" not in head
        (protocol,) = server.server_state.connections
        assert protocol.timeout_keep_alive_task is not None  # type: ignore[attr-defined]
        assert protocol._timer is None  # type: ignore[attr-defined]
        assert server.server_state.total_requests == 2
        async with asyncio.timeout(10):
            assert await reader.read(-1) == b""  # closed by the 2 s keep-alive
    finally:
        writer.close()
    assert app.asgi == []


def test_whole_answer_refuses_what_uvicorn_frames_itself() -> None:
    headers = [(b"server", b"uvicorn")]
    assert whole_answer(_GONE, "POST", headers, True) is not None
    assert whole_answer(_GONE, "HEAD", headers, True) is None
    assert whole_answer(Reply(204, [], b""), "POST", headers, True) is None
    assert whole_answer(Reply(200, [(b"X-Upper", b"1")], b""), "POST", headers, True) is None
    chunked = Reply(200, [(b"transfer-encoding", b"chunked")], b"")
    assert whole_answer(chunked, "POST", headers, True) is None


async def test_a_withheld_body_after_a_direct_answer_gets_nothing_more(
    served: tuple[_App, uvicorn.Server, int],
) -> None:
    """The answer is out; the body never comes: no 408 after it (the answer was given), the
    keep-alive closes the connection."""
    app, _, port = served
    got = await exchange(port, _request("/direct/a", extra=b"Content-Length: 10\r\n") + b"he")
    assert got.count(b"HTTP/1.1 ") == 1 and got.startswith(b"HTTP/1.1 410")
    assert app.asgi == []


async def test_a_client_that_does_not_read_gets_no_direct_answers(
    served: tuple[_App, uvicorn.Server, int],
) -> None:
    """While the connection's writes are paused (the client is not reading), a request goes the
    ASGI way, whose send waits for the client: answers do not pile up in the server's buffer."""
    app, server, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_request("/direct/a"))
        async with asyncio.timeout(10):
            await reader.readuntil(_GONE.body)
        (protocol,) = server.server_state.connections
        flow = protocol.flow  # type: ignore[attr-defined]
        flow.pause_writing()  # as the transport does past its high-water mark
        writer.write(_request("/direct/b"))
        await wait_until(lambda: app.asgi == ["/direct/b"], 10, 0.01, what="the ASGI call")
        flow.resume_writing()
        async with asyncio.timeout(10):
            assert (await reader.readuntil(_GONE.body)).startswith(b"HTTP/1.1 410")
    finally:
        writer.close()
    assert app.direct == [("POST", "/direct/a")]


async def test_requests_after_a_closing_answer_get_nothing(
    served: tuple[_App, uvicorn.Server, int], caplog: pytest.LogCaptureFixture
) -> None:
    """A request pipelined after one that asked to close: one answer, the connection closed, the
    second never asked for (the parser takes nothing after a closing request) nor an error."""
    app, _, port = served
    got = await exchange(port, _request("/direct/a", close=True) + _request("/direct/b"))
    assert got.count(b"HTTP/1.1 ") == 1 and b"connection: close\r\n" in got
    assert app.direct == [("POST", "/direct/a")]
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
