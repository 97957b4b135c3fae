"""The gateway pool's policy over the shared wire: LIFO reuse, expiry, which requests retry.

Connections are StreamReaders fed the server's bytes; no server runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from flashcoupon_common.http1 import ProtocolError
from flashcoupon_gateway import pool as pool_module
from flashcoupon_gateway.pool import HTTPPool

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


class _Peer:
    """The server's side of one connection: each request written gets the next scripted answer
    (b"" closes the connection instead of answering)."""

    def __init__(self, answers: list[bytes]) -> None:
        self.reader = asyncio.StreamReader()
        self.answers = answers
        self.sent: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent.append(data)
        answer = self.answers.pop(0)
        if answer:
            self.reader.feed_data(answer)
        else:
            self.reader.feed_eof()

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class _Server:
    """Hands out connections, the n-th one answering with the n-th script."""

    def __init__(self) -> None:
        self.scripts: list[list[bytes]] = []
        self.peers: list[_Peer] = []

    async def connect(self, host: str, port: int) -> pool_module._Pooled:
        await asyncio.sleep(0)  # as a real connect does: concurrent requests each get one
        peer = _Peer(self.scripts.pop(0))
        self.peers.append(peer)
        return pool_module._Pooled(peer.reader, peer)  # type: ignore[arg-type]


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Server]:
    fake = _Server()
    monkeypatch.setattr(pool_module._Pooled, "connect", fake.connect)
    yield fake


async def test_answers_reuse_the_kept_alive_connection(server: _Server) -> None:
    server.scripts = [[OK, OK]]
    pool = HTTPPool("http://issuer:8081")
    for _ in range(2):
        status, _, headers, body = await pool.request("GET", "/x", {}, deadline_seconds=1)
        assert (status, headers, body) == (200, [(b"content-length", b"2")], b"ok")
    (peer,) = server.peers
    assert peer.sent == 2 * [b"GET /x HTTP/1.1\r\nHost: issuer:8081\r\nContent-Length: 0\r\n\r\n"]


async def test_idle_connections_are_reused_lifo_and_dropped_after_expiry(server: _Server) -> None:
    server.scripts = [[OK, OK], [OK, OK], [OK]]
    pool = HTTPPool("http://issuer:8081", keepalive_expiry=0.05)
    await asyncio.gather(*(pool.request("GET", "/x", {}, deadline_seconds=1) for _ in range(2)))
    first, second = server.peers
    await pool.request("GET", "/x", {}, deadline_seconds=1)
    assert (len(first.sent), len(second.sent)) == (1, 2)  # the most recently idle one
    await asyncio.sleep(0.06)  # both idle past the expiry: closed, a new connection opens
    await pool.request("GET", "/x", {}, deadline_seconds=1)
    assert first.closed and second.closed and len(server.peers) == 3


@pytest.mark.parametrize(
    ("method", "headers", "retried"),
    [
        ("GET", {}, True),
        ("POST", {"Idempotency-Key": "k"}, True),
        ("POST", {}, False),  # the upstream may have acted: never sent twice
    ],
)
async def test_a_stale_reused_connection_is_retried_only_when_safe(
    server: _Server, method: str, headers: dict[str, str], retried: bool
) -> None:
    # The first connection answers once, then closes while the next request is on its way.
    server.scripts = [[OK, b""], [OK]]
    pool = HTTPPool("http://issuer:8081")
    await pool.request(method, "/x", headers, deadline_seconds=1)
    if retried:
        assert (await pool.request(method, "/x", headers, deadline_seconds=1))[0] == 200
        assert len(server.peers) == 2 and server.peers[1].sent == server.peers[0].sent[1:]
    else:
        with pytest.raises(ProtocolError, match="before an answer"):
            await pool.request(method, "/x", headers, deadline_seconds=1)
        assert len(server.peers) == 1
    assert server.peers[0].closed


async def test_a_fresh_connection_closed_before_answering_is_not_retried(
    server: _Server,
) -> None:
    server.scripts = [[b""]]
    with pytest.raises(ProtocolError, match="before an answer"):
        await HTTPPool("http://issuer:8081").request("GET", "/x", {}, deadline_seconds=1)
    assert len(server.peers) == 1


async def test_connect_failures_are_protocol_errors() -> None:
    # Port 9 (discard) on loopback is closed.
    with pytest.raises(ProtocolError, match=r"connect to 127\.0\.0\.1:9"):
        await HTTPPool("http://127.0.0.1:9").request("GET", "/x", {}, deadline_seconds=1)


GET_X = b"GET /x HTTP/1.1\r\nHost: issuer:8081\r\nContent-Length: 0\r\n\r\n"


async def test_send_now_writes_in_this_turn_and_answer_reads_it(server: _Server) -> None:
    server.scripts = [[OK, OK, OK]]
    pool = HTTPPool("http://issuer:8081")
    assert pool.send_now("GET", "/x", {}) is None  # no idle connection yet: nothing written
    await pool.request("GET", "/x", {}, deadline_seconds=1)
    (peer,) = server.peers
    sent = pool.send_now("GET", "/x", {})
    assert sent is not None and peer.sent == [GET_X, GET_X]  # written, no await in between
    assert pool.send_now("GET", "/x", {}) is None  # its connection is busy, none other idle
    status, _, _, body = await pool.answer(sent, deadline_seconds=1)
    assert (status, body) == (200, b"ok")
    await pool.request("GET", "/x", {}, deadline_seconds=1)  # back among the idle ones
    assert len(server.peers) == 1 and len(peer.sent) == 3


async def test_send_now_writes_nothing_when_the_pool_is_full_or_the_request_unsafe(
    server: _Server,
) -> None:
    server.scripts = [[OK, OK]]
    pool = HTTPPool("http://issuer:8081", max_connections=1)
    await pool.request("GET", "/x", {}, deadline_seconds=1)
    (peer,) = server.peers
    assert pool.send_now("GET", "/x", {"X-Bad": "a\r\nb"}) is None  # `request` raises it
    assert pool._slots.take_now()  # another request holds the pool's one slot
    assert pool.send_now("GET", "/x", {}) is None
    assert len(peer.sent) == 1
    pool._slots.give()
    sent = pool.send_now("GET", "/x", {})
    assert sent is not None and len(peer.sent) == 2  # on the connection left idle
    assert (await pool.answer(sent, deadline_seconds=1))[0] == 200


@pytest.mark.parametrize(("headers", "retried"), [({"Idempotency-Key": "k"}, True), ({}, False)])
async def test_a_sent_request_whose_idle_connection_was_stale_retries_only_when_safe(
    server: _Server, headers: dict[str, str], retried: bool
) -> None:
    server.scripts = [[OK, b""], [OK]]
    pool = HTTPPool("http://issuer:8081")
    await pool.request("POST", "/x", headers, deadline_seconds=1)
    sent = pool.send_now("POST", "/x", headers, b"{}")
    assert sent is not None
    if retried:
        assert (await pool.answer(sent, deadline_seconds=1))[0] == 200
        assert server.peers[1].sent == server.peers[0].sent[1:]
    else:
        with pytest.raises(ProtocolError, match="before an answer"):
            await pool.answer(sent, deadline_seconds=1)
        assert len(server.peers) == 1
    assert pool._slots.free == 100  # the slot was given back either way
    assert server.peers[0].closed


async def test_closing_the_pool_closes_a_sent_request_nobody_read(server: _Server) -> None:
    server.scripts = [[OK, OK]]
    pool = HTTPPool("http://issuer:8081")
    await pool.request("GET", "/x", {}, deadline_seconds=1)
    assert pool.send_now("GET", "/x", {}) is not None
    await pool.aclose()
    assert server.peers[0].closed


async def test_slots_are_handed_in_order_and_a_cancelled_waiter_passes_its_slot_on() -> None:
    slots = pool_module._Slots(1)
    assert slots.take_now() and not slots.take_now()
    first = asyncio.ensure_future(slots.take())
    second = asyncio.ensure_future(slots.take())
    await asyncio.sleep(0)
    assert not slots.take_now()  # waiters come first, even once a slot is free
    slots.give()  # handed to `first`...
    first.cancel()  # ...which goes away before it runs: `second` gets the slot
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert second.done() and first.cancelled() and slots.free == 0
    slots.give()
    assert slots.free == 1 and slots.take_now()
