"""sent_whole: a Reply written as one answer past uvicorn's `send`, inside a real uvicorn server.

Every answer it writes is compared byte for byte with the same Reply sent as the two ASGI
messages uvicorn takes (the date header aside), and every answer it must leave to uvicorn
(HEAD, framing headers, odd header lines, a wrapped `send`) is sent the usual way."""

from __future__ import annotations

import re

from flashcoupon_common.http import Reply
from flashcoupon_common.httpserver import sent_whole
from starlette.types import Message, Receive, Scope, Send

from tests.support.raw_http import exchange, serving

_BODY = b'{"code":"ABC-123"}'
_HEADERS = [(b"content-type", b"application/json"), (b"ratelimit-remaining", b"9")]
# What the app answers, by path: the Reply, and whether sent_whole may take it.
_REPLIES: dict[str, tuple[Reply, bool]] = {
    "/coupon": (Reply.of(201, _HEADERS, _BODY), True),
    "/gone": (Reply.of(410, [(b"content-type", b"application/problem+json")], b"{}"), True),
    "/empty": (Reply.of(200, [], b""), True),
    "/no-length": (Reply(200, _HEADERS, _BODY), False),  # uvicorn frames it as chunked
    "/wrong-length": (Reply(200, [(b"content-length", b"99")], _BODY), False),
    "/two-lengths": (Reply(200, [(b"content-length", b"2")] * 2, b"{}"), False),
    "/connection": (Reply.of(200, [(b"connection", b"close")], b"{}"), False),
    "/upper": (Reply.of(200, [(b"X-Upper", b"1")], b"{}"), False),  # uvicorn lower-cases it
    "/tab": (Reply.of(200, [(b"x-tab", b"a\tb")], b"{}"), True),
    "/no-content": (Reply(204, [], b""), False),
}
_TAKEN: list[tuple[str, bool]] = []  # (path, what sent_whole returned), in order


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    whole = path.startswith("/whole")
    reply, _ = _REPLIES[path.removeprefix("/whole")]
    if whole:
        if path.endswith("/wrapped"):
            reply, inner = _REPLIES["/coupon"][0], send

            async def wrapped(message: Message) -> None:
                await inner(message)

            taken = sent_whole(wrapped, reply)
            send = wrapped
        else:
            taken = sent_whole(send, reply)
        _TAKEN.append((path, taken))
        if taken:
            return
    await reply.send(send)


_REPLIES["/wrapped"] = _REPLIES["/coupon"][0], False

_DATE = re.compile(rb"date: [^\r]*\r\n")


def _request(path: str, method: str = "POST", close: bool = True) -> bytes:
    tail = b"Connection: close\r\n" if close else b""
    return b"%s %s HTTP/1.1\r\nHost: t\r\n%s\r\n" % (method.encode(), path.encode(), tail)


async def test_a_whole_answer_is_the_bytes_uvicorn_would_send() -> None:
    async with serving(_app) as (_, port):
        for path, (_, takes) in _REPLIES.items():
            _TAKEN.clear()
            as_messages = await exchange(port, _request(path))
            whole = await exchange(port, _request("/whole" + path))
            assert [taken for _, taken in _TAKEN] == [takes], path
            assert _DATE.sub(b"", whole) == _DATE.sub(b"", as_messages), path
            assert b"connection: close\r\n" in whole, path  # the client asked to close
        assert (await exchange(port, _request("/coupon")))[:12] == b"HTTP/1.1 201"

        # Kept alive: three pipelined presses on one connection, each answered whole, and the
        # connection still serves the next request (uvicorn's books kept: its next cycle ran).
        _TAKEN.clear()
        three = _request("/whole/coupon", close=False) * 3 + _request("/whole/gone")
        got = await exchange(port, three)
        assert got.count(b"HTTP/1.1 201 Created\r\n") == 3 and got.count(_BODY) == 3
        assert got.count(b"HTTP/1.1 410 Gone\r\n") == 1
        assert b"connection: close" not in got.split(b"HTTP/1.1 410")[0]
        assert [taken for _, taken in _TAKEN] == [True] * 4

        # A HEAD answer has no body on the wire: uvicorn's send knows that.
        _TAKEN.clear()
        head = await exchange(port, _request("/whole/coupon", method="HEAD"))
        assert _TAKEN == [("/whole/coupon", False)]
        assert head.startswith(b"HTTP/1.1 201") and not head.endswith(_BODY)
