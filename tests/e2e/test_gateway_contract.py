"""The public input contract through the gateway process, in front of real issuer and wallet
processes: one validation and one code vocabulary whichever service answers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from flashcoupon_common import event_state
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.gateway import assert_problem, bearer, provision
from tests.support.names import random_name
from tests.support.processes import Proc, gateway_proc, issuer_proc, wallet_proc
from tests.support.stack import Stack
from tests.support.wallet import add_coupon, add_event


@pytest.fixture(scope="module")
def issuer(stack: Stack) -> Iterator[Proc]:
    p = issuer_proc(stack).start()
    yield p
    p.stop()


@pytest.fixture
def gateway(stack: Stack, issuer: Proc, mysql_url: str, kafka_topic: str) -> Iterator[Proc]:
    wallet = wallet_proc(stack, mysql_url, kafka_topic).start()
    gw = gateway_proc(stack, issuer.url, wallet_url=wallet.url).start()
    try:
        yield gw
    finally:
        gw.stop()
        wallet.stop()


@pytest.fixture
async def client(gateway: Proc) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as c:
        yield c


async def test_event_id_with_a_trailing_newline_is_a_400_problem(
    client: httpx.AsyncClient, redis_cluster: Any
) -> None:
    spec = await provision(redis_cluster)
    good = spec.event_id
    for path in (
        f"/v1/events/{good}%0A/issue",
        f"/v1/events/{good}%0D%0A/issue",
        f"/v1/events/{good}%00/issue",
    ):
        r = await client.post(path, headers=bearer("nl-user"))
        assert_problem(r, 400, "INVALID_EVENT_ID")
    assert_problem(await client.get(f"/v1/events/{good}%0A"), 400, "INVALID_EVENT_ID")
    assert_problem(await client.get("/v1/events/Not_An_Id"), 400, "INVALID_EVENT_ID")
    # Nothing was issued to the user by the refused requests.
    r = await client.post(f"/v1/events/{good}/issue", headers=bearer("nl-user"))
    assert r.status_code == 201, r.text


async def test_one_code_per_mistake_from_gateway_and_issuer(
    client: httpx.AsyncClient, redis_cluster: Any
) -> None:
    spec = await provision(redis_cluster)
    r = await client.post(
        f"/v1/events/{spec.event_id}/issue",
        headers={**bearer("key-user"), "Idempotency-Key": "a,b"},
    )
    assert_problem(r, 400, "INVALID_IDEMPOTENCY_KEY")
    r = await client.post(
        f"/v1/events/{spec.event_id}/issue",
        headers={**bearer("key-user"), "Idempotency-Key": "k" * 65},
    )
    assert_problem(r, 400, "INVALID_IDEMPOTENCY_KEY")


async def test_paused_is_423_and_not_a_phase(client: httpx.AsyncClient, redis_cluster: Any) -> None:
    spec = await provision(redis_cluster)
    await event_state.set_paused(redis_cluster, spec.event_id, True)
    r = await client.post(f"/v1/events/{spec.event_id}/issue", headers=bearer("p-user"))
    assert_problem(r, 423, "PAUSED")
    state = (await client.get(f"/v1/events/{spec.event_id}")).json()
    assert state["phase"] == "Active" and state["paused"] is True


async def test_redeem_refuses_control_characters_and_bad_amounts_alike(
    client: httpx.AsyncClient, mysql_engine: AsyncEngine
) -> None:
    event = random_name("ev")
    await add_event(mysql_engine, event)
    code = await add_coupon(mysql_engine, event, "carol")
    url = f"/v1/coupons/{code}/redeem"
    carol = bearer("carol")
    bad = [
        {"orderId": "a\u0000b", "orderAmount": 100},
        {"orderId": "a\nb", "orderAmount": 100},
        {"orderId": "   ", "orderAmount": 100},
        {"orderId": "", "orderAmount": 100},
        {"orderId": "o", "orderAmount": 0},
        {"orderId": "o", "orderAmount": -1},
        {"orderId": "o", "orderAmount": 10**20},
        {"orderId": "o", "orderAmount": 1.5},
    ]
    for body in bad:
        r = await client.post(url, json=body, headers=carol)
        assert_problem(r, 422, "INVALID_REQUEST")
    assert_problem(await client.post(url, content=b"nope", headers=carol), 400, "MALFORMED_JSON")
    r = await client.post("/v1/coupons/bad%0A/redeem", json=bad[0], headers=carol)
    assert_problem(r, 400, "INVALID_COUPON_CODE")
    # None of them spent the coupon.
    r = await client.post(url, json={"orderId": "o-1", "orderAmount": 100}, headers=carol)
    assert r.status_code == 200, r.text


async def test_limit_is_validated_and_forwarded(
    client: httpx.AsyncClient, mysql_engine: AsyncEngine
) -> None:
    event = random_name("ev")
    await add_event(mysql_engine, event)
    user = random_name("dora")
    for seq in (1, 2):
        await add_coupon(mysql_engine, event, user, seq=seq)
    auth = bearer(user)
    for raw in ("0", "501", "abc", "", "-1"):
        r = await client.get(f"/v1/me/coupons?limit={raw}", headers=auth)
        assert_problem(r, 400, "INVALID_LIMIT")
    r = await client.get("/v1/me/coupons?limit=1", headers=auth)
    assert r.status_code == 200 and len(r.json()["coupons"]) == 1
    r = await client.get("/v1/me/coupons", headers=auth)
    assert r.status_code == 200 and len(r.json()["coupons"]) == 2
