"""The issuer floor (`make bench-issuer`'s floor path) against the real Redis Cluster: its
presses go through the issuer's batcher to issue.lua, so its coupons are issue.lua's own."""

from __future__ import annotations

import orjson
from flashcoupon_common import event_state, keys
from flashcoupon_common.coupon_math import coupon_code
from flashcoupon_loadtest.issuer_floor import IssuerFloor

from tests.support import asgi
from tests.support.floors import asgi_presses
from tests.support.issuer import make_spec
from tests.support.raw_http import exchange, serving


async def test_the_floor_issues_issue_luas_coupons(redis_cluster) -> None:
    spec = make_spec(2)
    await event_state.provision(redis_cluster, spec)
    path = f"/internal/v1/events/{spec.event_id}/issue"
    try:
        secret = (await redis_cluster.hget(keys.config_key(spec.event_id), "secret")).decode()
        async with asgi.running(IssuerFloor()) as app, asgi.client(app) as http:
            first = await http.post(path, headers={"X-Flashcoupon-User": "alice",
                                                   "Idempotency-Key": "k1"})  # fmt: skip
            again = await http.post(path, headers={"X-Flashcoupon-User": "alice",
                                                   "Idempotency-Key": "k2"})  # fmt: skip
            ready = await http.get("/readyz")
        assert first.status_code == 201
        coupon = orjson.loads(first.content)
        assert coupon["couponCode"] == coupon_code(secret, 0)
        assert (coupon["eventId"], coupon["userId"]) == (spec.event_id, "alice")
        assert (again.status_code, orjson.loads(again.content)) == (409, {"code": "DUPLICATE"})
        assert ready.status_code == 200
    finally:
        await event_state.delete_state(redis_cluster, spec.event_id)


async def test_under_uvicorn_the_floor_answers_directly(redis_cluster) -> None:
    """Served by uvicorn, the floor's presses are direct answers written once their script call
    is done (as the issuer's lone presses): the same answers, and no ASGI call for them."""
    spec = make_spec(2)
    await event_state.provision(redis_cluster, spec)
    floor = IssuerFloor()
    called = asgi_presses(floor)

    def raw(key: str) -> bytes:
        return (
            f"POST /internal/v1/events/{spec.event_id}/issue HTTP/1.1\r\nHost: t\r\n"
            f"X-Flashcoupon-User: bob\r\nIdempotency-Key: {key}\r\nConnection: close\r\n\r\n"
        ).encode()

    try:
        async with serving(floor) as (_, port):
            first, again = await exchange(port, raw("k1")), await exchange(port, raw("k2"))
        assert first.startswith(b"HTTP/1.1 201") and b'"userId":"bob"' in first
        assert again.startswith(b"HTTP/1.1 409") and again.endswith(b'{"code":"DUPLICATE"}')
        assert called == []
    finally:
        await event_state.delete_state(redis_cluster, spec.event_id)
