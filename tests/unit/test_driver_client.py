"""The driver's pieces that need no server: request bytes, response parsing, JWTs, the plan."""

from __future__ import annotations

import asyncio
from collections import Counter

import jwt
import pytest
from flashcoupon_common import http1
from flashcoupon_loadtest.driver import WorkerContext
from flashcoupon_loadtest.http1 import (
    Connection,
    ProtocolError,
    Target,
    build_request,
    request_line,
)
from flashcoupon_loadtest.scenarios import Burst, Press, classify, press_tail
from flashcoupon_loadtest.stats import ISSUED
from flashcoupon_loadtest.tokens import TokenMinter


class _Sink:
    """Stands in for the socket's write side: the bytes are only collected."""

    def __init__(self) -> None:
        self.sent = b""

    def write(self, data: bytes) -> None:
        self.sent += data

    def close(self) -> None:
        pass


def _wire(data: bytes, sink: _Sink) -> http1.Connection:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return http1.Connection(reader, sink)  # type: ignore[arg-type]


def _conn_reading(wire: bytes) -> tuple[Connection, _Sink]:
    conn = Connection(Target.parse("http://127.0.0.1:8080"))
    sink = _Sink()
    conn._conn = _wire(wire, sink)
    return conn, sink


def test_target_parse_and_request_bytes() -> None:
    t = Target.parse("https://shop.example.com/api/")
    assert (t.scheme, t.host, t.port, t.prefix) == ("https", "shop.example.com", 443, "/api")
    raw = build_request(t, "POST", "/v1/x", {"Idempotency-Key": "k"})
    assert raw == (
        b"POST /api/v1/x HTTP/1.1\r\nHost: shop.example.com\r\nIdempotency-Key: k\r\n"
        b"Content-Length: 0\r\n\r\n"
    )
    assert build_request(t, "GET", "/healthz") == (
        b"GET /api/healthz HTTP/1.1\r\nHost: shop.example.com\r\n\r\n"
    )
    with pytest.raises(ValueError):
        Target.parse("ftp://x")


async def test_keep_alive_answers_in_sequence_and_chunked_bodies() -> None:
    wire = (
        b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{}"
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        b"HTTP/1.1 410 Gone\r\nconnection: close\r\ncontent-length: 1\r\n\r\nx"
    )
    conn, sink = _conn_reading(wire)
    assert (await conn.request(b"A"))[::2] == (201, b"{}")
    assert (await conn.request(b"B"))[::2] == (200, b"hello world")
    assert (await conn.request(b"C"))[::2] == (410, b"x")
    assert sink.sent == b"AB" + b"C"
    assert conn._conn is not None and not conn._conn.open  # the server said close: reconnect


def test_classify_issue_answers() -> None:
    assert classify(201, b'{"couponCode":"AB12","tier":"big"}') == (ISSUED, "AB12")
    assert classify(410, b'{"code":"SOLD_OUT","status":410}') == ("SOLD_OUT", "")
    assert classify(202, b'{"ticket":"t"}') == ("QUEUED", "")
    assert classify(502, b"<html>bad gateway</html>") == ("HTTP_502", "")


def test_minted_tokens_verify_with_pyjwt() -> None:
    token = TokenMinter("s3cret-s3cret-s3cret-s3cret-s3cret!", audience="flashcoupon").mint(
        "user-7"
    )
    claims = jwt.decode(
        token, "s3cret-s3cret-s3cret-s3cret-s3cret!", algorithms=["HS256"], audience="flashcoupon"
    )
    assert claims["sub"] == "user-7"
    assert claims["exp"] > claims["iat"]
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(
            token,
            "another-secret-another-secret-another",
            algorithms=["HS256"],
            audience="flashcoupon",
        )


def test_burst_plan_shards_users_with_duplicates_and_retries() -> None:
    burst = Burst(event_id="ev", users=10_000, dup_fraction=0.1, retry_fraction=0.05)
    shards = [
        list(burst.plan(WorkerContext(i, 3, (Target.parse("http://h:1"),)))) for i in range(3)
    ]
    users = [s.user for shard in shards for s in shard]
    assert len(users) == len(set(users)) == 10_000  # every shopper once, in exactly one shard
    kinds = Counter(p.kind for shard in shards for s in shard for p in s.presses)
    assert kinds["first"] == 10_000
    assert 350 < kinds["retry"] < 650
    assert 1000 < kinds["dup"] < 2100  # 10 % press again, once or twice more
    for s in shards[0][:200]:
        keys = [p.key for p in s.presses]
        retry_keys = [p.key for p in s.presses if p.kind == "retry"]
        assert all(k == s.presses[0].key for k in retry_keys)  # a retry re-sends the same key
        assert len(set(keys)) == len(keys) - len(retry_keys)  # every other press has its own key
        assert s.lines.startswith(b"Authorization: Bearer ")


def test_sse_parser_keeps_incomplete_events_for_the_next_chunk() -> None:
    from flashcoupon_loadtest.waiting_room import parse_sse

    events, rest = parse_sse(b'retry: 2000\n\nevent: position\ndata: {"position": 3}\n\nevent: res')
    assert events == [("position", b'{"position": 3}')]
    events, rest = parse_sse(rest + b'ult\ndata: {"status": 201}\n\n')
    assert events == [("result", b'{"status": 201}')]
    assert rest == b""


async def test_a_keep_alive_closed_while_idle_is_retried_once_on_a_new_connection() -> None:
    conn, sink = _conn_reading(b"")  # the server closed the idle connection: EOF at once
    fresh = _wire(b"HTTP/1.1 410 Gone\r\ncontent-length: 2\r\n\r\n{}", sink)

    async def reconnect() -> http1.Connection:
        return fresh

    conn._open = reconnect  # type: ignore[method-assign]
    assert (await conn.request(b"REQ"))[::2] == (410, b"{}")
    assert sink.sent == b"REQREQ"  # sent once on the dead connection, once on the new one


async def test_a_fresh_connection_closed_before_answering_is_an_error() -> None:
    conn = Connection(Target.parse("http://127.0.0.1:8080"))  # not reused: not sent again

    async def connect() -> http1.Connection:
        return _wire(b"", _Sink())

    conn._open = connect  # type: ignore[method-assign]
    with pytest.raises(ProtocolError):
        await conn.request(b"REQ")


async def test_a_refused_connect_is_a_connection_error_record_not_a_crash() -> None:
    import socket

    from flashcoupon_loadtest.stats import Record

    with socket.socket() as probe:  # a port nobody listens on: bound, then closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conn = Connection(Target.parse(f"http://127.0.0.1:{port}"))
    with pytest.raises(ProtocolError, match="cannot connect"):
        await conn.request(b"REQ")
    burst = Burst(event_id="e", users=1)
    record = await burst.press(conn, b"", "u", Press("first", "k", press_tail("k")), 0.0)
    assert isinstance(record, Record)
    assert (record.status, record.code) == (0, "CONNECTION_ERROR")


def test_a_press_request_is_the_one_build_request_makes() -> None:
    target = Target.parse("http://127.0.0.1:8080/shop")
    burst = Burst(event_id="ev-1", users=3, dup_fraction=1.0, forwarded_for=True)
    ctx = WorkerContext(0, 1, (target,))
    minter = burst.minter()
    for shopper in burst.plan(ctx):
        headers = burst.shopper_headers(minter, shopper.index, shopper.user)
        assert "X-Forwarded-For" in headers
        for press in shopper.presses:
            raw = request_line(target, "POST", burst.path) + shopper.lines + press.tail
            expected = {**headers, "Idempotency-Key": press.key}
            assert raw == build_request(target, "POST", burst.path, expected)


async def _silent_server() -> tuple[asyncio.Server, int]:
    """A loopback server that reads requests and never answers."""

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_an_answer_later_than_the_timeout_is_a_timeout_and_closes_the_connection() -> None:
    server, port = await _silent_server()
    async with server:
        target = Target.parse(f"http://127.0.0.1:{port}")
        conn = Connection(target)
        await conn.connect()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await conn.request(build_request(target, "GET", "/"), timeout=0.2)
        assert 0.2 <= loop.time() - started < 2.0
        assert conn._conn is not None and not conn._conn.open  # out of step: never reused
        burst = Burst(event_id="e", users=1, timeout=0.1)
        record = await burst.press(conn, b"", "u", Press("first", "k", press_tail("k")), 0.0)
        assert (record.status, record.code) == (0, "TIMEOUT")  # reconnected, then timed out


async def test_an_answer_within_the_timeout_leaves_no_deadline_behind() -> None:
    answer = b"HTTP/1.1 410 Gone\r\ncontent-length: 2\r\n\r\n{}"

    async def answer_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readuntil(b"\r\n\r\n"):
            writer.write(answer)

    server = await asyncio.start_server(answer_each, "127.0.0.1", 0)
    async with server:
        target = Target.parse(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        conn = Connection(target)
        raw = build_request(target, "GET", "/")
        assert (await conn.request(raw, timeout=0.2))[::2] == (410, b"{}")
        first = conn._conn
        await asyncio.sleep(0.3)  # past the first request's deadline
        assert first is not None and first.open  # its timer was cancelled with the answer
        assert (await conn.request(raw, timeout=0.2))[::2] == (410, b"{}")
        assert conn._conn is first
        conn.close()


async def _server_answering(first: int) -> tuple[asyncio.Server, int]:
    """A loopback server that answers the first `first` requests of a connection, then none."""
    answer = b"HTTP/1.1 410 Gone\r\ncontent-length: 2\r\n\r\n{}"

    async def answer_some(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered = 0
        while await reader.readuntil(b"\r\n\r\n"):
            if answered < first:
                writer.write(answer)
                answered += 1

    server = await asyncio.start_server(answer_some, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_answered_requests_share_one_alarm_per_timeout() -> None:
    # The deadline costs a timer once per timeout's length, not once per request: that was
    # ~4.5 us of the driver's CPU a press, counted against the server it measures.
    server, port = await _server_answering(first=50)
    async with server:
        target = Target.parse(f"http://127.0.0.1:{port}")
        conn = Connection(target)
        raw = build_request(target, "GET", "/")
        await conn.request(raw, timeout=5.0)
        alarm = conn._alarm
        assert alarm is not None
        for _ in range(20):
            assert (await conn.request(raw, timeout=5.0))[::2] == (410, b"{}")
        assert conn._alarm is alarm
        conn.close()
        assert alarm.cancelled()


@pytest.mark.parametrize(
    ("first", "pause", "second"),
    [
        # The alarm, set for the first (answered) request, goes off before the second's
        # deadline: that must neither end the second early nor let it run on past it.
        (0.3, 0.2, 0.3),
        # The alarm is set 30 s ahead: a shorter timeout must set it sooner.
        (30.0, 0.0, 0.2),
    ],
)
async def test_each_request_times_out_at_its_own_deadline(
    first: float, pause: float, second: float
) -> None:
    server, port = await _server_answering(first=1)
    async with server:
        target = Target.parse(f"http://127.0.0.1:{port}")
        conn = Connection(target)
        raw = build_request(target, "GET", "/")
        loop = asyncio.get_running_loop()
        assert (await conn.request(raw, timeout=first))[::2] == (410, b"{}")
        await asyncio.sleep(pause)
        started = loop.time()
        with pytest.raises(TimeoutError):
            await conn.request(raw, timeout=second)
        assert second <= loop.time() - started < 1.0
        assert conn._conn is not None and not conn._conn.open
