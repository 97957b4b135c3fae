"""The gateway's Forwarder against a real socket server that answers fixed bytes.

An upstream's HTTP server can refuse a request before its application runs (uvicorn's
plain-text 400 "Invalid HTTP request received.", its plain-text 500): the shopper must get a
problem+json instead. And the application's own headers worth keeping (Idempotent-Replayed)
must come through.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from flashcoupon_common.http import ProblemError
from flashcoupon_gateway.upstream import Forwarder


def _answer(status_line: bytes, content_type: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return b"%s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n%s" % (
        status_line,
        content_type,
        len(body),
        extra,
        body,
    )


@asynccontextmanager
async def forwarder_to(answer: bytes) -> AsyncIterator[Forwarder]:
    """A Forwarder whose issuer and wallet are a server writing `answer` to every request."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    fwd = Forwarder(
        (url,), url, connections=4, timeout_seconds=2, failure_threshold=5, open_seconds=5
    )
    try:
        yield fwd
    finally:
        await fwd.aclose()
        server.close()


TEXT = b"text/plain; charset=utf-8"
NOT_JSON = [
    # uvicorn's own answer to a request its parser refused: what issue 10 saw relayed.
    _answer(b"HTTP/1.1 400 Bad Request", TEXT, b"Invalid HTTP request received.", b"x: y\r\n"),
    _answer(b"HTTP/1.1 500 Internal Server Error", TEXT, b"Internal Server Error"),
    _answer(b"HTTP/1.1 404 Not Found", b"text/html", b"<h1>nope</h1>"),
]


@pytest.mark.parametrize("answer", NOT_JSON)
async def test_an_upstream_error_that_is_not_json_becomes_a_502_problem(answer: bytes) -> None:
    async with forwarder_to(answer) as fwd:
        up = fwd.pick_issuer("alice")
        with pytest.raises(ProblemError) as caught:
            await fwd.call(up, "POST", "/internal/v1/events/e/issue", {"X-Flashcoupon-User": "a"})
    assert (caught.value.status, caught.value.code) == (502, "BAD_UPSTREAM")


async def test_problem_answers_and_idempotent_replayed_are_passed_through() -> None:
    problem = _answer(
        b"HTTP/1.1 409 Conflict", b"application/problem+json", b'{"code":"DUPLICATE"}'
    )
    async with forwarder_to(problem) as fwd:
        answer = await fwd.call(fwd.pick_issuer("a"), "POST", "/x", {})
    assert answer.status == 409 and answer.body == b'{"code":"DUPLICATE"}'

    replay = _answer(
        b"HTTP/1.1 201 Created", b"application/json", b"{}", b"idempotent-replayed: true\r\n"
    )
    async with forwarder_to(replay) as fwd:
        answer = await fwd.call(fwd.pick_issuer("a"), "POST", "/x", {"Idempotency-Key": "k"})
    assert answer.status == 201
    assert answer.header(b"idempotent-replayed") == "true"
