"""Gateway → wallet process: my coupons and redeem, with the user taken from the token."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.gateway import assert_problem, bearer
from tests.support.names import random_name
from tests.support.processes import Proc, gateway_proc, wallet_proc
from tests.support.stack import Stack
from tests.support.wallet import add_coupon, add_event


@pytest.fixture
def wallet_and_gateway(stack: Stack, mysql_url: str, kafka_topic: str) -> Iterator[Proc]:
    wallet = wallet_proc(stack, mysql_url, kafka_topic).start()
    # The issuer is not needed here; its URL only has to be well-formed.
    gateway = gateway_proc(stack, "http://127.0.0.1:9", wallet_url=wallet.url).start()
    try:
        yield gateway
    finally:
        gateway.stop()
        wallet.stop()


async def test_my_coupons_and_redeem_through_the_gateway(
    wallet_and_gateway: Proc, mysql_engine: AsyncEngine
) -> None:
    event = random_name("ev")
    await add_event(mysql_engine, event)
    code = await add_coupon(mysql_engine, event, "alice")
    async with httpx.AsyncClient(base_url=wallet_and_gateway.url, timeout=10) as c:
        mine = await c.get("/v1/me/coupons", headers=bearer("alice"))
        assert mine.status_code == 200, mine.text
        assert [x["couponCode"] for x in mine.json()["coupons"]] == [code]
        # Bob claiming to be alice through the header sees his own (empty) wallet.
        spoof = await c.get(
            "/v1/me/coupons", headers={**bearer("bob"), "X-Flashcoupon-User": "alice"}
        )
        assert spoof.status_code == 200 and spoof.json()["coupons"] == []
        order = {"orderId": "o-1", "orderAmount": 25_000}
        not_his = await c.post(f"/v1/coupons/{code}/redeem", json=order, headers=bearer("bob"))
        assert_problem(not_his, 403)
        r = await c.post(f"/v1/coupons/{code}/redeem", json=order, headers=bearer("alice"))
        assert r.status_code == 200, r.text
        again = await c.post(
            f"/v1/coupons/{code}/redeem", json={**order, "orderId": "o-2"}, headers=bearer("alice")
        )
        assert_problem(again, 409)
