"""The gateway as a process in front of the real issuer process: auth, forwarding, bad input,
the waiting room's SSE stream. Shared helpers: tests/support/gateway.py and processes.py."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from flashcoupon_common import event_state

from tests.support.gateway import assert_problem, bearer, provision
from tests.support.processes import Proc, gateway_proc, issuer_proc
from tests.support.stack import Stack


@pytest.fixture(scope="module")
def issuer(stack: Stack) -> Iterator[Proc]:
    p = issuer_proc(stack).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def gateway(stack: Stack, issuer: Proc) -> Iterator[Proc]:
    p = gateway_proc(stack, issuer.url).start()
    yield p
    p.stop()


@pytest.fixture
async def client(gateway: Proc) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as c:
        yield c


async def test_issue_uses_the_token_user_and_ignores_a_spoofed_header(
    client: httpx.AsyncClient, redis_cluster: Any
) -> None:
    spec = await provision(redis_cluster)
    headers = {**bearer("alice"), "X-Flashcoupon-User": "mallory"}
    r = await client.post(f"/v1/events/{spec.event_id}/issue", headers=headers)
    assert r.status_code == 201, r.text
    assert r.json()["userId"] == "alice" and r.json()["couponCode"]
    assert {"ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"} <= set(r.headers)
    # The spoofed name got nothing: mallory can still get her own coupon, alice cannot again.
    again = await client.post(f"/v1/events/{spec.event_id}/issue", headers=headers)
    assert_problem(again, 409, "DUPLICATE")
    r = await client.post(f"/v1/events/{spec.event_id}/issue", headers=bearer("mallory"))
    assert r.status_code == 201 and r.json()["userId"] == "mallory"
    state = await client.get(f"/v1/events/{spec.event_id}")
    assert state.status_code == 200 and state.json()["phase"] in ("Active", "active")


async def test_bad_tokens_are_401_with_www_authenticate(client: httpx.AsyncClient) -> None:
    path = "/v1/events/some-event/issue"
    bad = {
        "missing": {},
        "forged": bearer("alice", secret="not-the-gateway-secret-0123456789abcdef"),
        "expired": bearer("alice", ttl=-60),
        "wrong audience": bearer("alice", aud="another-service"),
        "garbage": {"Authorization": "Bearer abc.def.ghi"},
        "basic": {"Authorization": "Basic YWxpY2U6cHc="},
    }
    for name, headers in bad.items():
        r = await client.post(path, headers={**headers, "X-Flashcoupon-User": "alice"})
        assert_problem(r, 401, "UNAUTHORIZED")
        assert r.headers["www-authenticate"].startswith("Bearer"), name
    for method, p in [("GET", "/v1/me/coupons"), ("GET", "/v1/events/x/queue/1.2.3")]:
        assert_problem(await client.request(method, p), 401, "UNAUTHORIZED")


async def test_bad_input_is_4xx_problem_never_5xx(client: httpx.AsyncClient) -> None:
    auth = bearer("bob")
    cases = [
        ("POST", "/v1/events/ev/issue", {"content": b"{" * 10_000}, 413),
        ("POST", "/v1/events/ev/issue", {"content": b"{not json"}, 400),
        ("POST", "/v1/events/ev/issue", {"content": b"[1, 2]"}, 400),
        ("POST", "/v1/events/Not_An_Id/issue", {}, 400),
        ("POST", "/v1/events/ev/issue", {"headers": {"Idempotency-Key": "a b,c"}}, 400),
        ("POST", "/v1/coupons/ABC/redeem", {"content": b"nope"}, 400),
        ("POST", "/v1/coupons/ABC/redeem", {"json": {"orderId": 5}}, 422),
        ("POST", "/v1/coupons/ABC/redeem", {"json": {"orderId": "o", "orderAmount": "x"}}, 422),
        ("POST", "/v1/coupons/ABC/redeem", {"content": b'{"a":"' + b"x" * 9000 + b'"}'}, 413),
        ("POST", "/v1/coupons/bad%20code/redeem", {"json": {}}, 400),
        ("GET", "/v1/events/ev/queue/forged.1.x", {}, 404),
        ("GET", "/no/such/route", {}, 404),
        ("DELETE", "/v1/events/ev/issue", {}, 405),
    ]
    for method, path, kw, status in cases:
        headers = {**auth, **kw.pop("headers", {})}
        r = await client.request(method, path, headers=headers, **kw)
        assert_problem(r, status)
        assert r.json()["detail"], (method, path)
    # The server still answers normally afterwards.
    assert (await client.get("/healthz")).status_code == 200


async def test_openapi_is_served_and_matches_the_committed_copy(client: httpx.AsyncClient) -> None:
    served = (await client.get("/openapi.json")).json()
    committed = orjson.loads((Path(__file__).parents[2] / "docs" / "openapi.json").read_bytes())
    assert served == committed
    assert served["openapi"].startswith("3.1")


async def test_waiting_room_sse_counts_down_then_issues(
    client: httpx.AsyncClient, redis_cluster: Any
) -> None:
    spec = await provision(
        redis_cluster, waiting_room_enabled=True, waiting_room_admit_per_second=5
    )
    eid = spec.event_id
    users = [f"sse-{i}" for i in range(12)]
    answers = await asyncio.gather(
        *(client.post(f"/v1/events/{eid}/issue", headers=bearer(u)) for u in users)
    )
    queued = {u: r.json() for u, r in zip(users, answers, strict=True) if r.status_code == 202}
    assert len(queued) >= 8, [r.status_code for r in answers]
    assert all(r.status_code in (201, 202) for r in answers)
    last_user = max(queued, key=lambda u: queued[u]["position"])
    q = queued[last_user]
    assert q["etaSeconds"] >= 1 and q["statusUrl"].endswith(q["ticket"])
    # The ticket is bound to its shopper.
    other = await client.get(q["statusUrl"], headers=bearer("someone-else"))
    assert_problem(other, 404, "TICKET_NOT_FOUND")
    status = await client.get(q["statusUrl"], headers=bearer(last_user))
    assert status.json()["state"] == "queued" and status.json()["position"] >= 1

    events: list[tuple[str, Any]] = []
    headers = {**bearer(last_user), "Accept": "text/event-stream"}
    async with client.stream("GET", q["statusUrl"], headers=headers) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        name = None
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, orjson.loads(line[6:])))
    kinds = [k for k, _ in events]
    assert kinds[-2:] == ["admitted", "result"], kinds
    positions = [d["position"] for k, d in events if k == "position"]
    assert len(positions) >= 2 and positions == sorted(positions, reverse=True), positions
    result = events[-1][1]
    assert result["status"] == 201 and result["body"]["userId"] == last_user
    # The admission was used: the ticket is gone, and a second issue is a DUPLICATE.
    after = await client.get(q["statusUrl"], headers=bearer(last_user))
    assert after.json()["state"] == "gone"
    dup = await client.post(f"/v1/events/{eid}/issue", headers=bearer(last_user))
    assert dup.status_code in (202, 409)

    # Without SSE: poll the JSON status until admitted, then press again to get the coupon.
    first_user = min(queued, key=lambda u: queued[u]["position"])
    url = queued[first_user]["statusUrl"]
    for _ in range(100):
        state = (await client.get(url, headers=bearer(first_user))).json()
        if state["state"] != "queued":
            break
        await asyncio.sleep(0.1)
    assert state["state"] == "admitted" and state["position"] == 0, state
    r = await client.post(f"/v1/events/{eid}/issue", headers=bearer(first_user))
    assert r.status_code == 201 and r.json()["userId"] == first_user


async def test_sold_out_is_answered_by_the_gateway_but_holders_retries_reach_the_issuer(
    client: httpx.AsyncClient, issuer: Proc, redis_cluster: Any
) -> None:
    spec = await provision(redis_cluster, quantity=2)
    path = f"/v1/events/{spec.event_id}/issue"
    first = await client.post(path, headers={**bearer("so-1"), "Idempotency-Key": "so-1-k"})
    assert first.status_code == 201
    assert (await client.post(path, headers=bearer("so-2"))).status_code == 201
    assert_problem(await client.post(path, headers=bearer("so-3")), 410, "SOLD_OUT")
    # The sell-out reaches the gateway asynchronously (pub/sub, usually within tens of ms),
    # and its next read of the event (SPEC_CACHE_SECONDS, 1 s) says so too: past both.
    await asyncio.sleep(1.1)

    def issuer_410s(text: str) -> float:
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("flashcoupon_http_requests_total{")
            and "issue" in line
            and 'status="410"' in line
        )

    before = issuer_410s((await client.get(issuer.url + "/metrics")).text)
    for i in range(5):
        assert_problem(await client.post(path, headers=bearer(f"late-{i}")), 410, "SOLD_OUT")
    # A key does not make a shopper holding nothing a holder: answered here too.
    keyed = {**bearer("late-k"), "Idempotency-Key": "late-k-1"}
    for _ in range(2):  # the second press is answered by the sold-out lane (token cached)
        late = await client.post(path, headers=keyed)
        assert_problem(late, 410, "SOLD_OUT")
        assert late.headers["content-type"] == "application/problem+json"
        assert late.json()["detail"] == f"event {spec.event_id} is sold out"
    # Answered by the gateway: the issuer saw none of them.
    assert issuer_410s((await client.get(issuer.url + "/metrics")).text) == before
    # A retry with the same Idempotency-Key gets its coupon back, sold out or not.
    retry = await client.post(path, headers={**bearer("so-1"), "Idempotency-Key": "so-1-k"})
    assert retry.status_code == 201, retry.text
    assert retry.json()["couponCode"] == first.json()["couponCode"]


# 32 is the default; 4 makes most batches full, each written as it fills, several per turn.
@pytest.mark.parametrize("batch_max", ["32", "4", "0"])
async def test_a_crowd_through_the_gateway_is_answered_press_by_press_batched_or_not(
    stack: Stack, issuer: Proc, redis_cluster: Any, batch_max: str
) -> None:
    """200 shoppers pressing at once for 50 coupons: exactly 50 coupons, to 50 different
    shoppers, everyone else 410 — whether the gateway forwards presses in batches (the
    default) or one by one (ISSUE_BATCH_MAX=0). Batched, its histogram shows batches of
    more than one press; a keyed retry inside a batch gets its own coupon back."""
    from tests.support.metrics import scraped

    gateway = gateway_proc(stack, issuer.url, issue_batch_max=batch_max).start()
    try:
        spec = await provision(redis_cluster, quantity=50)
        path = f"/v1/events/{spec.event_id}/issue"
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30, limits=limits) as c:
            tokens = [bearer(f"crowd-{batch_max}-{i}") for i in range(200)]
            answers = await asyncio.gather(*(c.post(path, headers=t) for t in tokens))
            issued = [r.json() for r in answers if r.status_code == 201]
            assert len(issued) == 50
            assert len({b["couponCode"] for b in issued}) == 50
            assert len({b["userId"] for b in issued}) == 50
            for r in answers:
                if r.status_code != 201:
                    assert_problem(r, 410, "SOLD_OUT")
            winner = issued[0]["userId"]
            keyed = {**bearer(winner), "Idempotency-Key": "crowd-k"}
            retry = await c.post(path, headers=keyed)  # first keyed press: DUPLICATE w/ coupon
            assert retry.status_code == 409 and retry.json()["coupon"] == issued[0]
            metrics = (await c.get("/metrics")).text
        count = scraped(metrics, "flashcoupon_gateway_issue_batch_size_count")
        presses = scraped(metrics, "flashcoupon_gateway_issue_batch_size_sum")
        if batch_max == "0":
            assert count == 0
        else:
            assert count >= 1 and presses >= 51 and presses > count, (count, presses)
    finally:
        gateway.stop()


@pytest.mark.parametrize("batch_max", ["256", "0"])
async def test_a_crowd_from_many_addresses_is_limited_per_address_before_the_issuer(
    stack: Stack, issuer: Proc, redis_cluster: Any, batch_max: str
) -> None:
    """Each shopper from its own address (X-Forwarded-For through one trusted proxy), as a
    drop's crowd arrives, and five behind one address: an address over its limit gets 429
    scope ip and nothing is issued for it (its press never reaches a batch); every other press
    is issued, with its shopper's allowance decided in the issue call, and carries its
    RateLimit headers — batched or not."""
    from tests.support.metrics import scraped

    gateway = gateway_proc(
        stack,
        issuer.url,
        issue_batch_max=batch_max,
        trusted_proxies="1",
        ip_per_second="0.01",  # a token per 100 s: an address presses twice, whatever the pace
        ip_burst="2",
    ).start()
    try:
        spec = await provision(redis_cluster, quantity=1000)
        path = f"/v1/events/{spec.event_id}/issue"
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30, limits=limits) as c:
            # Addresses of this run only: an address's tokens come back once per 100 s.
            net = f"10.{os.urandom(1)[0]}.{os.urandom(1)[0]}"
            crowd = [
                {**bearer(f"addr-{batch_max}-{i}"), "X-Forwarded-For": f"{net}.{i}"}
                for i in range(60)
            ]
            shared = [
                {**bearer(f"nat-{batch_max}-{i}"), "X-Forwarded-For": f"{net}.200"}
                for i in range(5)
            ]
            answers = await asyncio.gather(*(c.post(path, headers=h) for h in crowd + shared))
            metrics = (await c.get("/metrics")).text
        statuses = [r.status_code for r in answers]
        assert statuses[:60] == [201] * 60, statuses
        assert sorted(statuses[60:]) == [201, 201, 429, 429, 429], statuses[60:]
        for r in answers:
            if r.status_code == 429:
                assert_problem(r, 429, "RATE_LIMITED")
                assert r.json()["scope"] == "ip" and int(r.headers["retry-after"]) >= 1
            else:
                assert "ratelimit-remaining" in r.headers
        state = await event_state.read_state(redis_cluster, spec.event_id)
        assert state is not None and state.issued == 62  # nothing for the refused presses
        if batch_max != "0":  # presses refused at the gate are not forwarded
            assert scraped(metrics, "flashcoupon_gateway_issue_batch_size_sum") == 62
    finally:
        gateway.stop()
