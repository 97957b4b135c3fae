"""The HTTP edge of the gateway and issuer processes (issue 10, items 1, 4, 6, 7, 12).

User ids of any script cross gateway → issuer → Redis → wallet byte-exact; nothing unchecked
is written upstream; slow or vanishing clients are cut off and counted as what they are;
whatever the HTTP server refuses is problem+json; replays say so.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
from flashcoupon_common import keys
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.gateway import assert_problem, bearer, provision, token
from tests.support.metrics import scraped
from tests.support.names import random_name
from tests.support.ports import free_port
from tests.support.processes import BIN, Proc, gateway_proc, wallet_proc
from tests.support.stack import Stack
from tests.support.wallet import add_coupon, add_event

# Short read deadlines, so the slow-client tests take seconds; the bound asserted is loose.
TIMEOUT = "2"
ISSUE_ROUTE, REDEEM_ROUTE = "/v1/events/{eventId}/issue", "/v1/coupons/{code}/redeem"
NON_ASCII = ["josé-X", "josè-X", "日本語-ユーザー", "🎟️-fan", "Ωμέγα"]


@pytest.fixture(scope="module")
def issuer(stack: Stack) -> Iterator[Proc]:
    env = {
        **stack.env(),
        "FLASHCOUPON_ISSUER_HEADER_TIMEOUT_SECONDS": TIMEOUT,
        "FLASHCOUPON_ISSUER_BODY_TIMEOUT_SECONDS": TIMEOUT,
    }
    p = Proc([str(BIN / "flashcoupon-issuer")], env, free_port()).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def gateway(stack: Stack, issuer: Proc) -> Iterator[Proc]:
    p = gateway_proc(
        stack, issuer.url, header_timeout_seconds=TIMEOUT, body_timeout_seconds=TIMEOUT
    ).start()
    yield p
    p.stop()


@pytest.fixture
async def client(gateway: Proc) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as c:
        yield c


def exchange(port: int, raw: bytes, *, wait: float = 30.0) -> tuple[float, bytes]:
    """Send `raw` on a fresh connection; (seconds until the server closed it, what it sent)."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(wait)
        start = time.monotonic()
        s.sendall(raw)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pytest.fail(f"connection still open after {wait} s; got {out[:200]!r}")
        except ConnectionResetError:
            pass
        return time.monotonic() - start, out


def parse(answer: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, orjson.loads(body)


# --- item 1: user ids of any script, byte-exact --------------------------------------------


async def test_non_ascii_user_ids_are_distinct_users_stored_exactly(
    client: httpx.AsyncClient, redis_cluster: Any
) -> None:
    spec = await provision(redis_cluster)
    path = f"/v1/events/{spec.event_id}/issue"
    codes = {}
    for user in NON_ASCII:
        r = await client.post(path, headers=bearer(user))
        assert r.status_code == 201, (user, r.status_code, r.text)
        assert r.json()["userId"] == user
        codes[user] = r.json()["couponCode"]
    assert len(set(codes.values())) == len(NON_ASCII)
    # A second press is the user's own DUPLICATE, carrying their own coupon, nobody else's.
    for user in NON_ASCII:
        again = await client.post(path, headers=bearer(user))
        assert_problem(again, 409, "DUPLICATE")
        assert again.json()["coupon"]["couponCode"] == codes[user]
        assert again.json()["coupon"]["userId"] == user
    # Redis holds each id as its exact UTF-8 bytes (the relay carries them on to MySQL).
    held = await redis_cluster.hkeys(keys.users_key(spec.event_id))
    assert sorted(held) == sorted(u.encode() for u in NON_ASCII)


@pytest.fixture
def wallet_gateway(stack: Stack, mysql_url: str, kafka_topic: str) -> Iterator[Proc]:
    wallet = wallet_proc(stack, mysql_url, kafka_topic).start()
    gateway = gateway_proc(stack, "http://127.0.0.1:9", wallet_url=wallet.url).start()
    try:
        yield gateway
    finally:
        gateway.stop()
        wallet.stop()


async def test_the_wallet_serves_non_ascii_owners_and_says_when_a_redeem_is_replayed(
    wallet_gateway: Proc, mysql_engine: AsyncEngine
) -> None:
    event = random_name("ev")
    await add_event(mysql_engine, event)
    mine = {u: await add_coupon(mysql_engine, event, u) for u in ("josé-X", "日本語-ユーザー")}
    async with httpx.AsyncClient(base_url=wallet_gateway.url, timeout=10) as c:
        for user, code in mine.items():
            r = await c.get("/v1/me/coupons", headers=bearer(user))
            assert r.status_code == 200, r.text
            assert r.json()["userId"] == user
            assert [x["couponCode"] for x in r.json()["coupons"]] == [code]
        # josè-X is someone else: no coupons, and josé-X's coupon is not theirs to spend.
        other = await c.get("/v1/me/coupons", headers=bearer("josè-X"))
        assert other.status_code == 200 and other.json()["coupons"] == []
        order = {"orderId": "o-1", "orderAmount": 25_000}
        code = mine["josé-X"]
        assert_problem(
            await c.post(f"/v1/coupons/{code}/redeem", json=order, headers=bearer("josè-X")), 403
        )
        first = await c.post(f"/v1/coupons/{code}/redeem", json=order, headers=bearer("josé-X"))
        assert first.status_code == 200, first.text
        assert "idempotent-replayed" not in first.headers
        # item 12: the wallet's replay marker reaches the shopper.
        replay = await c.post(f"/v1/coupons/{code}/redeem", json=order, headers=bearer("josé-X"))
        assert replay.status_code == 200 and replay.json() == first.json()
        assert replay.headers["idempotent-replayed"] == "true"


# --- item 12: the issuer's replay marker ----------------------------------------------------


async def test_a_keyed_issue_replay_says_idempotent_replayed(
    client: httpx.AsyncClient, redis_cluster: Any
) -> None:
    spec = await provision(redis_cluster)
    path = f"/v1/events/{spec.event_id}/issue"
    headers = {**bearer("replayer"), "Idempotency-Key": "replay-k1"}
    first = await client.post(path, headers=headers)
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    again = await client.post(path, headers=headers)
    assert again.status_code == 201 and again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"


# --- item 4: nothing unchecked is written upstream ------------------------------------------


async def test_control_bytes_in_the_path_never_reach_the_issuer(
    client: httpx.AsyncClient, issuer: Proc
) -> None:
    before = (await client.get(issuer.url + "/metrics")).text
    for path in ["/v1/events/qa-e%0A/issue", "/v1/events/qa-e%0D%0A/issue", "/v1/events/qa-e%0A"]:
        method = "POST" if path.endswith("/issue") else "GET"
        r = await client.request(method, path, headers=bearer("injector"))
        assert r.status_code in (400, 404), (path, r.status_code, r.text)
        assert r.headers["content-type"] == "application/problem+json", (path, r.text)
        assert r.json()["code"] in ("INVALID_CHARACTERS", "EVENT_NOT_FOUND", "INVALID_EVENT_ID")
    after = (await client.get(issuer.url + "/metrics")).text
    # The issuer's parser never saw a broken request line.
    name = "flashcoupon_http_rejected_total"
    assert scraped(after, name, reason="malformed") == scraped(before, name, reason="malformed")


async def test_control_bytes_in_a_forwarded_header_are_a_400_not_a_split_request(
    client: httpx.AsyncClient, redis_cluster: Any
) -> None:
    spec = await provision(redis_cluster)
    r = await client.post(
        f"/v1/events/{spec.event_id}/issue",
        headers={**bearer("tabby"), "X-Request-Id": "a\tb"},
    )
    assert_problem(r, 400, "INVALID_CHARACTERS")


# --- item 7: what the HTTP server refuses is problem+json too -------------------------------


@pytest.mark.parametrize("service", ["gateway", "issuer"])
@pytest.mark.parametrize(
    "length_headers",
    [
        b"Content-Length: -1\r\n",
        b"Content-Length: 100000000000000000000\r\n",
        b"Content-Length: abc\r\n",
        b"Content-Length: 2\r\nContent-Length: 2\r\n",
    ],
)
def test_malformed_content_length_is_a_problem_json_400(
    service: str, length_headers: bytes, request: pytest.FixtureRequest
) -> None:
    proc: Proc = request.getfixturevalue(service)
    path = b"/v1/events/ev/issue" if service == "gateway" else b"/internal/v1/events/ev/issue"
    raw = b"POST " + path + b" HTTP/1.1\r\nHost: t\r\n" + length_headers + b"\r\n{}"
    _, answer = exchange(proc.port, raw)
    status, headers, body = parse(answer)
    assert status == 400 and headers["content-type"] == "application/problem+json", answer
    assert body["code"] == "MALFORMED_REQUEST" and "Content-Length" in body["detail"]
    assert headers["connection"] == "close"


# --- item 6: slow and vanishing clients -----------------------------------------------------


@pytest.mark.parametrize("service", ["gateway", "issuer"])
def test_an_unfinished_head_is_answered_408_and_closed(
    service: str, request: pytest.FixtureRequest
) -> None:
    proc: Proc = request.getfixturevalue(service)
    held, answer = exchange(proc.port, b"POST /v1/events/ev/issue HTTP/1.1\r\nHost: t\r\nX-A: ")
    status, headers, body = parse(answer)
    assert status == 408 and body["code"] == "REQUEST_TIMEOUT", answer
    assert headers["content-type"] == "application/problem+json"
    assert held < 10, held  # cut off at the 2 s deadline; it used to be held indefinitely
    # A connection that sends nothing at all is closed too, without an answer.
    held, answer = exchange(proc.port, b"")
    assert answer == b"" and held < 10, held


def test_a_short_body_is_answered_408_within_the_deadline(gateway: Proc) -> None:
    head = b"POST /v1/events/ev/issue HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "
    raw = head + token("slow-body").encode() + b'\r\nContent-Length: 100\r\n\r\n{"a":'
    held, answer = exchange(gateway.port, raw)
    status, headers, body = parse(answer)
    assert status == 408 and body["code"] == "REQUEST_TIMEOUT", answer
    assert headers["content-type"] == "application/problem+json"
    assert held < 10, held  # instead of being held until the client gives up (120 s)


def leave_mid_body(port: int, path: bytes) -> None:
    """Declare a 100-byte body, send 5 bytes of it, hang up."""
    head = b"POST " + path + b" HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(head + token("leaver").encode() + b'\r\nContent-Length: 100\r\n\r\n{"a":')
        time.sleep(0.3)


async def test_a_client_gone_mid_body_is_a_499_not_an_error(
    client: httpx.AsyncClient, gateway: Proc
) -> None:
    name = "flashcoupon_http_requests_total"
    routes = {b"/v1/events/ev/issue": ISSUE_ROUTE, b"/v1/coupons/ABC/redeem": REDEEM_ROUTE}

    async def counts() -> dict[tuple[str, str], float]:
        text = (await client.get("/metrics")).text
        return {
            (r, s): scraped(text, name, route=r, status=s)
            for r in routes.values()
            for s in ("499", "500")
        }

    before = await counts()
    for path in routes:
        await asyncio.to_thread(leave_mid_body, gateway.port, path)
    expected = {**before, **{(r, "499"): before[r, "499"] + 1 for r in routes.values()}}
    for _ in range(50):  # the gateway notices the hang-up at once; allow for a busy machine
        after = await counts()
        if after == expected:
            break
        await asyncio.sleep(0.1)
    assert after == expected
    assert "Traceback" not in gateway.output() and "unhandled error" not in gateway.output()
