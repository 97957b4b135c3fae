"""Direct answers (httpserver.DirectAnswer) inside a real uvicorn server.

An app with `direct_answer` answers some requests the moment their head is read, without
uvicorn's request cycle or its ASGI call. Every direct answer is compared byte for byte with the
same Reply sent through ASGI (the date header aside), and the connection's books are checked as
uvicorn keeps them: kept alive (its keep-alive timer armed, no read timer of the guard), closed
when asked, a pipelined ASGI request after a direct answer and a direct one behind an ASGI answer
in progress, a body left unread, requests the direct path must leave to ASGI. A `Later` answer
(written once its future is done) keeps the same books, and those of an answer in progress:
requests pipelined behind it wait, a client gone gets nothing, a shutdown closes after it."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from flashcoupon_common.http import Reply
from flashcoupon_common.httpserver import Later, whole_answer
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
        self.later: dict[str, asyncio.Future[Any]] = {}  # /later/* path -> what its answer awaits
        self.answered_later: list[str] = []

    def direct_answer(self, scope: Scope) -> Reply | Later | None:
        self.direct.append((scope["method"], scope["path"]))
        path = scope["path"]
        if path.startswith("/later/"):
            waits_on = self.later[path] = asyncio.get_running_loop().create_future()

            def answer(done: asyncio.Future[Any]) -> Reply:
                assert done is waits_on and done.done()
                self.answered_later.append(path)
                if path == "/later/raise":
                    raise RuntimeError("the app's own mistake")
                if path == "/later/cancelled":
                    return done.result()  # type: ignore[no-any-return]  # raises CancelledError
                return _GONE if path != "/later/headless" else Reply(204, [], b"")

            return Later(waits_on, answer)
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
    # Header lines are checked once per pair and remembered: a refused pair stays refused, a
    # pair's line is the same bytes each time, a control character in a value is refused.
    odd = Reply.of(200, [(b"x-odd", b"a\x01b")], b"")
    for _ in range(2):
        assert whole_answer(odd, "POST", headers, True) is None
        assert whole_answer(_GONE, "POST", headers, False) == whole_answer(
            _GONE, "POST", headers, False
        )
    assert whole_answer(_GONE, "POST", headers, True) == (
        b"HTTP/1.1 410 Gone\r\nserver: uvicorn\r\ncontent-type: application/problem+json\r\n"
        b"content-length: 19\r\n\r\n" + _GONE.body
    )


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


async def _settle_when_asked(app: _App, path: str) -> None:
    await wait_until(lambda: path in app.later, 10, 0.01, what=f"{path} asked")
    await asyncio.sleep(0.05)  # the answer waits: nothing may be written meanwhile
    app.later[path].set_result(None)


async def _answer(reader: asyncio.StreamReader) -> bytes:
    async with asyncio.timeout(10):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
        return head + await reader.readexactly(length)


async def test_a_later_answer_is_written_once_its_future_is_done(
    served: tuple[_App, uvicorn.Server, int],
) -> None:
    """Nothing is written while the future waits; then the bytes the ASGI path sends, the
    request counted, the connection kept alive (keep-alive timer armed, no read timer) and its
    next request served."""
    app, server, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_request("/later/a"))
        await wait_until(lambda: "/later/a" in app.later, 10, 0.01, what="/later/a asked")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await reader.read(1)
        (protocol,) = server.server_state.connections
        assert protocol._timer is None  # type: ignore[attr-defined]  # answering: no read timer
        assert server.server_state.total_requests == 0 and not server.server_state.tasks
        app.later["/later/a"].set_result(None)
        later = await _answer(reader)
        assert protocol.timeout_keep_alive_task is not None  # type: ignore[attr-defined]
        assert protocol._timer is None  # type: ignore[attr-defined]
        assert server.server_state.total_requests == 1
        writer.write(_request("/direct/b"))
        assert (await _answer(reader)).startswith(b"HTTP/1.1 410")
    finally:
        writer.close()
    through_asgi = await exchange(port, _request("/asgi"))
    assert b"connection: close" not in later and app.answered_later == ["/later/a"]
    assert _DATE.sub(b"", later) == _DATE.sub(
        b"", through_asgi.replace(b"connection: close\r\n", b"")
    )
    assert app.asgi == ["/asgi"]


async def test_requests_pipelined_behind_a_later_answer_wait_their_turn(
    served: tuple[_App, uvicorn.Server, int],
) -> None:
    """A Later answer is an answer in progress: what is pipelined behind it is queued by
    uvicorn (answered through ASGI, in order, after it); its body is read and dropped."""
    app, _, port = served
    with_body = _request("/later/a", extra=b"Content-Length: 5\r\n") + b"hello"
    raw = with_body + _request("/asgi") + _request("/direct/c", close=True)
    settle = asyncio.create_task(_settle_when_asked(app, "/later/a"))
    got = await exchange(port, raw)
    await settle
    assert got.count(b"HTTP/1.1 410 Gone\r\n") == 3 and got.count(b"connection: close\r\n") == 1
    assert [path for _, path in app.direct] == ["/later/a"]
    assert app.asgi == ["/asgi", "/direct/c"] and app.answered_later == ["/later/a"]


async def test_a_client_gone_while_its_answer_waits_is_written_nothing(
    served: tuple[_App, uvicorn.Server, int], caplog: pytest.LogCaptureFixture
) -> None:
    """The answer is still made (the app counts it) but goes nowhere, counted as no request
    served, and nothing is logged as an error."""
    app, server, port = served
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request("/later/a"))
    await wait_until(lambda: "/later/a" in app.later, 10, 0.01, what="/later/a asked")
    writer.close()
    await wait_until(lambda: not server.server_state.connections, 10, 0.01, what="disconnect")
    app.later["/later/a"].set_result(None)
    await wait_until(lambda: app.answered_later == ["/later/a"], 10, 0.01, what="the answer")
    await asyncio.sleep(0.05)
    assert server.server_state.total_requests == 0
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


async def test_a_later_answer_that_fails_is_a_logged_500(
    served: tuple[_App, uvicorn.Server, int], caplog: pytest.LogCaptureFixture
) -> None:
    """An answer that raises (an error, or the cancellation of what it waited for), or one the
    server cannot write whole (a 204), is answered 500 problem+json and logged; the first two keep
    the connection, the last closes it."""
    app, _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_request("/later/raise"))
        await _settle_when_asked(app, "/later/raise")
        failed = await _answer(reader)
        assert failed.startswith(b"HTTP/1.1 500") and b'"code":"INTERNAL"' in failed
        assert b"application/problem+json" in failed and b"connection: close" not in failed
        writer.write(_request("/later/cancelled"))
        await wait_until(lambda: "/later/cancelled" in app.later, 10, 0.01, what="asked")
        app.later["/later/cancelled"].cancel()
        cancelled = await _answer(reader)
        assert cancelled.startswith(b"HTTP/1.1 500") and b"connection: close" not in cancelled
        writer.write(_request("/later/headless"))
        await _settle_when_asked(app, "/later/headless")
        odd = await _answer(reader)
        assert odd.startswith(b"HTTP/1.1 500") and b"connection: close" in odd
        async with asyncio.timeout(10):
            assert await reader.read(-1) == b""
    finally:
        writer.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.exc_info is not None for r in errors] == [True, True, False]


async def test_a_shutdown_waits_for_a_later_answer_and_closes_after_it(
    served: tuple[_App, uvicorn.Server, int],
) -> None:
    """uvicorn's graceful shutdown asks the connection to end after its answer in progress:
    the Later answer is still written, with `connection: close`, then the connection closes."""
    app, server, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_request("/later/a"))
        await wait_until(lambda: "/later/a" in app.later, 10, 0.01, what="/later/a asked")
        server.should_exit = True
        await asyncio.sleep(0.3)  # past the shutdown's request to every connection
        assert server.server_state.connections
        app.later["/later/a"].set_result(None)
        async with asyncio.timeout(10):
            got = await reader.read(-1)
        assert got.startswith(b"HTTP/1.1 410") and b"connection: close\r\n" in got
    finally:
        writer.close()
